"""The `aicirt` command line: build controllers, run them on a model, inspect them."""
from __future__ import annotations

import sys

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="aicirt")
def main() -> None:
    """aicirt: sandboxed WebAssembly controllers that steer LLM decoding token by token.

    \b
    Typical use:
      aicirt build controllers/regex -o regex.wasm   # C/Zig source -> controller module
      aicirt check regex.wasm                        # does the runtime accept it?
      aicirt run regex --arg '[0-9]{3}-[0-9]{4}' --prompt 'Call me at '
    """


# --- build ----------------------------------------------------------------------------------------
@main.command()
@click.argument("src")
@click.option("-o", "--out", type=click.Path(dir_okay=False), default=None,
              help="Output module (default: ./<name>.wasm).")
def build(src: str, out: str | None) -> None:
    """Compile a C file, Zig file or controller folder to a controller module.

    SRC may also name a shipped controller (yesno, choice, regex, splice, countdown, json).
    """
    from pathlib import Path

    from aicirt.toolchain import BuildError, build as build_controller

    try:
        r = build_controller(src, Path(out) if out else None)
    except BuildError as e:
        raise click.ClickException(e.message) from None
    click.echo(f"{r.path}: {r.size:,} bytes in {r.seconds:.2f} s")


# --- check --------------------------------------------------------------------------------------
@main.command()
@click.argument("module", type=click.Path(exists=True, dir_okay=False))
def check(module: str) -> None:
    """Check that a .wasm file is a controller the runtime accepts (SPEC §2), before uploading it.

    Names whatever is missing or mistyped (exports, imports, signatures) and exits non-zero.
    """
    from aicirt import LoadError
    from aicirt.controller import check_controller

    try:
        ctrl = check_controller(module)
    except LoadError as e:
        raise click.ClickException(str(e)) from None
    imports = sorted(imp.name for imp in ctrl.module.imports)
    click.echo(f"{module}: a controller ({ctrl.size:,} bytes, sha256 {ctrl.sha256[:12]})")
    click.echo(f"  imports: {', '.join(imports) or 'none'}")
    click.echo(f"  post-return: {'yes' if ctrl.has_post else 'no'}; reactor init: {'yes' if ctrl.has_initialize else 'no'}; "
               f"mutable globals copied on fork: {len(ctrl.globals)}")


# --- run ------------------------------------------------------------------------------------------
@main.command()
@click.argument("controller")
@click.option("--arg", "arg", default=None, help="Controller argument (text).")
@click.option("--arg-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Read the controller argument from a file (bytes as is).")
@click.option("--prompt", "-p", default="", show_default=True, help="User prompt.")
@click.option("--max-tokens", "-n", type=click.IntRange(min=1), default=64, show_default=True,
              help="Tokens a sequence may append (sampled or fast-forwarded).")
@click.option("--temperature", "-t", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Sampling temperature; 0 = greedy.")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True)
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True, help="0 = off.")
@click.option("--seed", type=int, default=None, help="Sampling seed (default: random).")
@click.option("--model", "-m", default=None,
              help="smollm2 (default), a .gguf file, a Hugging Face model folder, llamacpp:FILE.gguf or scripted.")
@click.option("--no-chat", is_flag=True, help="Send the prompt as is, without the model's chat template.")
@click.option("--json", "as_json", is_flag=True, help="Print one machine-readable JSON result instead of streaming.")
@click.option("--logs", is_flag=True, help="Show controller logs (stderr).")
def run(controller: str, arg: str | None, arg_file: str | None, prompt: str, max_tokens: int, temperature: float,
        top_p: float, top_k: int, seed: int | None, model: str | None, no_chat: bool, as_json: bool,
        logs: bool) -> None:
    """Run a controller on a model and stream what it generates.

    \b
    CONTROLLER is a .wasm file, a C/Zig file or folder (built on the fly and cached), or the
    name of a shipped controller (controllers/<name>): yesno, regex, choice, ...
    Forks are labelled [#N]; text a controller took back is shown struck through after ⌫.
    """
    from aicirt import AicirtError
    from aicirt.run_command import run as run_controller
    from aicirt.toolchain import BuildError

    if arg is not None and arg_file is not None:
        raise click.UsageError("give --arg or --arg-file, not both")
    arg_bytes = open(arg_file, "rb").read() if arg_file else (arg or "").encode("utf-8")
    try:
        run_controller(controller, arg=arg_bytes, prompt=prompt, max_tokens=max_tokens, temperature=temperature,
                       seed=seed, model=model, as_json=as_json, show_logs=logs, chat=not no_chat, top_p=top_p,
                       top_k=top_k)
    except (BuildError, AicirtError, FileNotFoundError, ValueError) as e:
        raise click.ClickException(str(e)) from None


if __name__ == "__main__":
    sys.exit(main())
