"""The `aicirt` command line: build controllers, run them on a model, inspect them."""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

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

    SRC may also name a shipped controller (yesno, choice, regex, splice, countdown, json, grammar).
    """
    from pathlib import Path

    from aicirt.build.toolchain import BuildError, build as build_controller

    try:
        r = build_controller(src, Path(out) if out else None)
    except BuildError as e:
        raise click.ClickException(e.message) from None
    click.echo(f"{r.path}: {r.size:,} bytes in {r.seconds:.2f} s")


# --- check --------------------------------------------------------------------------------------
@main.command()
@click.argument("module", type=click.Path(exists=True, dir_okay=False))
def check(module: str) -> None:
    """Check that a .wasm file is a controller the runtime accepts (docs/protocol.md#wit), before uploading it.

    Names whatever is missing or mistyped (exports, imports, signatures) and exits non-zero.
    """
    from aicirt import LoadError
    from aicirt.loader.controller import check_controller

    if module.endswith((".js", ".ts")):   # a script: parsed as the js controller will (docs/js.md)
        from pathlib import Path

        from aicirt.build.toolchain import checked_script
        try:
            checked_script(Path(module))
        except ValueError as e:
            raise click.ClickException(str(e)) from None
        click.echo(f"{module}: a script for the js controller that parses")
        return
    try:
        ctrl = check_controller(module)
    except LoadError as e:
        raise click.ClickException(str(e)) from None
    imports = sorted(imp.name or "" for imp in ctrl.module.imports)
    click.echo(f"{module}: a controller ({ctrl.size:,} bytes, sha256 {ctrl.sha256[:12]})")
    click.echo(f"  imports: {', '.join(imports) or 'none'}")
    click.echo(f"  post-return: {'yes' if ctrl.has_post else 'no'}; reactor init: {'yes' if ctrl.has_initialize else 'no'}; "
               f"mutable globals copied on fork: {len(ctrl.globals)}")


# --- run ------------------------------------------------------------------------------------------
def _server_options(fn: Callable[..., None]) -> Callable[..., None]:
    """--server/--api-key (work against a running `aicirt serve`) and --store (the local store)."""
    fn = click.option("--store", type=click.Path(file_okay=False), default=None,
                      help="Local store folder [env AICIRT_STORE; default: the user's data folder].")(fn)
    fn = click.option("--api-key", envvar="AICIRT_API_KEY", default=None,
                      help="The server's API key [env AICIRT_API_KEY].")(fn)
    return click.option("--server", envvar="AICIRT_SERVER", default=None,
                        help="Work against a server (http://HOST:PORT) instead of locally [env AICIRT_SERVER].")(fn)


def _engine_options(fn: Callable[..., None]) -> Callable[..., None]:
    """--engine and vLLM's: --tensor-parallel-size, --data-parallel-size, --vllm-arg (docs/vllm.md)."""
    fn = click.option("--vllm-arg", "vllm_args", multiple=True, metavar="KEY=VALUE",
                      help="Another vllm.EngineArgs field for --engine vllm (VALUE as JSON where it parses), "
                           "e.g. max_num_seqs=128; repeatable.")(fn)
    fn = click.option("--data-parallel-size", type=click.IntRange(min=1), default=None,
                      help="--engine vllm: data-parallel ranks for aicirt serve, each an engine process of its own "
                           "behind the one server [default: 1; docs/deployment.md].")(fn)
    fn = click.option("--tensor-parallel-size", type=click.IntRange(min=1), default=None,
                      help="--engine vllm: tensor-parallel ranks [default: 1].")(fn)
    return click.option("--engine", type=click.Choice(["own", "vllm"]), default=None,
                        help="own: aicirt's engine (transformers, llama.cpp) [default]; vllm: vLLM's scheduler, "
                             "paged KV cache and prefix caching, the whole protocol (docs/vllm.md).")(fn)


def _vllm_options(engine: str | None, tp: int | None, dp: int | None, vllm_args: tuple[str, ...]) -> dict:
    """VllmEngine's keyword arguments from the flags; a UsageError for vLLM flags without --engine vllm."""
    if engine != "vllm":
        if tp is not None or dp is not None or vllm_args:
            raise click.UsageError("--tensor-parallel-size, --data-parallel-size and --vllm-arg need --engine vllm")
        return {}
    from aicirt.engine.vllm_engine import parse_vllm_args

    try:
        return {"tensor_parallel_size": tp or 1, "data_parallel_size": dp or 1,
                "engine_args": parse_vllm_args(vllm_args)}
    except ValueError as e:
        raise click.UsageError(str(e)) from None


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
@_engine_options
@_server_options
def run(controller: str, arg: str | None, arg_file: str | None, prompt: str, max_tokens: int, temperature: float,
        top_p: float, top_k: int, seed: int | None, model: str | None, no_chat: bool, as_json: bool,
        logs: bool, engine: str | None, tensor_parallel_size: int | None, data_parallel_size: int | None,
        vllm_args: tuple[str, ...], server: str | None, api_key: str | None, store: str | None) -> None:
    """Run a controller on a model and stream what it generates.

    \b
    CONTROLLER is a .wasm file, a C/Zig file or folder (built on the fly and cached), the
    name of a shipped controller (controllers/<name>): yesno, regex, choice, ..., or a tag or
    module id from the store. With --server it runs there (a local file is uploaded first).
    Forks are labelled [#N]; text a controller took back is shown struck through after ⌫.
    """
    from aicirt import AicirtError
    from aicirt.runner.run import run as run_controller
    from aicirt.serve.client import Client, ServerError
    from aicirt.serve.commands import run_remote
    from aicirt.serve.store import Store, resolve_controller
    from aicirt.build.toolchain import BuildError

    if arg is not None and arg_file is not None:
        raise click.UsageError("give --arg or --arg-file, not both")
    arg_bytes = open(arg_file, "rb").read() if arg_file else (arg or "").encode("utf-8")
    vllm_options = _vllm_options(engine, tensor_parallel_size, data_parallel_size, vllm_args)
    if (data_parallel_size or 1) > 1:
        raise click.UsageError("--data-parallel-size is for aicirt serve: one run is one request, on one rank")
    try:
        if server:
            if engine:
                raise click.UsageError("--engine is the server's choice (aicirt serve --engine), not the client's")
            if model:
                raise click.UsageError("--model is the server's choice (aicirt serve --model), not the client's")
            run_remote(Client(server, api_key), controller, arg=arg_bytes, prompt=prompt, max_tokens=max_tokens,
                       temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, chat=not no_chat,
                       as_json=as_json, show_logs=logs)
            return
        wasm = resolve_controller(controller, Store(store), progress=True)
        run_controller(str(wasm), arg=arg_bytes, prompt=prompt, max_tokens=max_tokens, temperature=temperature,
                       seed=seed, model=model, as_json=as_json, show_logs=logs, chat=not no_chat, top_p=top_p,
                       top_k=top_k, engine=engine or "own", vllm_options=vllm_options)
    except (BuildError, AicirtError, FileNotFoundError, ValueError, ServerError) as e:
        if as_json and getattr(e, "result", None) is None:   # --json: one JSON object, even when nothing ran
            import json

            click.echo(json.dumps({"error": getattr(e, "message", None) or str(e)}))
            raise SystemExit(1) from None
        raise click.ClickException(str(e)) from None


# --- the store: upload, tags, ls, rm ---------------------------------------------------------------
def _store_errors(fn: Callable[..., None]) -> Callable[..., None]:
    """Store, build, load and server errors as one-line CLI errors."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kw: Any) -> None:
        from aicirt import AicirtError
        from aicirt.serve.client import ServerError
        from aicirt.build.toolchain import BuildError

        try:
            return fn(*args, **kw)
        except BuildError as e:
            raise click.ClickException(e.message) from None
        except (AicirtError, FileNotFoundError, ValueError, ServerError) as e:
            raise click.ClickException(str(e)) from None
    return wrapper


@main.command()
@click.argument("src")
@click.option("-t", "--tag", "tags", multiple=True, help="Tag to point at the module (repeatable).")
@_server_options
@_store_errors
def upload(src: str, tags: tuple[str, ...], server: str | None, api_key: str | None, store: str | None) -> None:
    """Store a controller module (a .wasm file, or a C/Zig source, folder or shipped name, built first).

    Prints its module id (the sha256 of the Wasm) and the tags now pointing at it.
    """
    from aicirt.serve.commands import format_upload, open_target, upload as do_upload

    click.echo("\n".join(format_upload(do_upload(open_target(server, api_key, store), src, list(tags)))))


@main.command()
@_server_options
@_store_errors
def tags(server: str | None, api_key: str | None, store: str | None) -> None:
    """List tags: name, module, size, when and by whom it was last set."""
    from aicirt.serve.commands import format_tags, open_target

    click.echo("\n".join(format_tags(open_target(server, api_key, store).tags())))


@main.command()
@_server_options
@_store_errors
def ls(server: str | None, api_key: str | None, store: str | None) -> None:
    """List stored modules: id, size, compiled size, created, by whom, tags."""
    from aicirt.serve.commands import format_modules, open_target

    click.echo("\n".join(format_modules(open_target(server, api_key, store).modules())))


@main.command()
@click.argument("names", nargs=-1, required=True)
@_server_options
@_store_errors
def rm(names: tuple[str, ...], server: str | None, api_key: str | None, store: str | None) -> None:
    """Remove tags (the module stays) or modules by id (with their tags)."""
    from aicirt.serve.commands import format_removed, open_target

    target = open_target(server, api_key, store)
    for name in names:
        click.echo(format_removed(target.remove(name)))


# --- serve ----------------------------------------------------------------------------------------
@main.command()
@click.option("--config", "config", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A settings file (TOML or JSON): setting names as below (max_batch = 8), limits in a "
                   "[limits] table. Flags and the environment win over it.")
@click.option("--host", default=None, help="Address to listen on [default: 127.0.0.1].")
@click.option("--port", type=click.IntRange(0, 65535), default=None, help="[default: 4242]")
@click.option("--model", "-m", default=None, help="As for `aicirt run` (default: smollm2; scripted for tests).")
@click.option("--api-key", envvar="AICIRT_API_KEY", default=None,
              help="Require this key (header `api-key` or `Authorization: Bearer`) [env AICIRT_API_KEY].")
@click.option("--allow-remote", is_flag=True, default=None,
              help="Listen on a non-loopback address without an API key.")
@click.option("--store", type=click.Path(file_okay=False), default=None,
              help="Controller store folder [env AICIRT_STORE; default: the user's data folder].")
@click.option("--max-batch", type=int, default=None, help="Requests decoding at once [default: 64].")
@click.option("--max-queue", type=int, default=None,
              help="Requests waiting beyond those; more get 503 with Retry-After [default: 256].")
@click.option("--max-context", type=int, default=None,
              help="Prompt + generated tokens per sequence [default: the model's].")
@click.option("--default-max-tokens", type=int, default=None,
              help="Tokens a request may generate when it gives no max_tokens [default: 256].")
@click.option("--max-upload-bytes", type=int, default=None, help="Largest controller upload [default: 64 MiB].")
@click.option("--workers", type=int, default=None, help="Controller threads [default: 2].")
@click.option("--limit", "limits", multiple=True, metavar="NAME=VALUE",
              help="A controller sandbox limit (aicirt.Limits; seconds, bytes), e.g. call_timeout_s=0.5; "
                   "repeatable. `GET /v1/config` lists them all.")
@_engine_options
def serve(config: str | None, host: str | None, port: int | None, model: str | None, api_key: str | None,
          allow_remote: bool | None, store: str | None, max_batch: int | None, max_queue: int | None,
          max_context: int | None, default_max_tokens: int | None, max_upload_bytes: int | None,
          workers: int | None, limits: tuple[str, ...], engine: str | None, tensor_parallel_size: int | None,
          data_parallel_size: int | None, vllm_args: tuple[str, ...]) -> None:
    """Serve controllers over HTTP: AICI's REST API and OpenAI's (docs/server.md).

    One engine shared by every request (continuous batching). Without --api-key it listens only
    on a loopback address unless --allow-remote is given. Settings come from the flags, then
    the environment, then --config, then the defaults; a wrong one is named in the error.
    """
    import json

    from aicirt.serve.commands import serve as do_serve
    from aicirt.serve.settings import Settings

    opts = _vllm_options(engine, tensor_parallel_size, data_parallel_size, vllm_args)
    try:
        given_limits = {}
        for item in limits:
            name, sep, value = item.partition("=")
            if not sep or not name.strip():
                raise ValueError(f"--limit takes NAME=VALUE, got {item!r}")
            given_limits[name.strip()] = value.strip()
        settings = Settings.load(config, limits=given_limits, host=host, port=port, model=model, api_key=api_key,
                                 allow_remote=allow_remote or None, store=store, max_batch=max_batch, max_queue=max_queue,
                                 max_context=max_context, default_max_tokens=default_max_tokens,
                                 max_upload_bytes=max_upload_bytes, workers=workers, engine=engine,
                                 tensor_parallel_size=tensor_parallel_size, data_parallel_size=data_parallel_size,
                                 vllm_args=json.dumps(opts["engine_args"]) if opts.get("engine_args") else None)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    run_server = do_serve
    if settings.data_parallel_size > 1:   # N ranks behind one front server (docs/deployment.md)
        from aicirt.integrations.vllm_dp_app import serve_dp as run_server
    try:
        run_server(settings)
    except (FileNotFoundError, ImportError, RuntimeError) as e:
        raise click.ClickException(str(e)) from None


# --- fuzz -----------------------------------------------------------------------------------------
@main.command()
@click.argument("controller", required=False)
@click.option("--steps", "-n", type=click.IntRange(min=1), default=2000, show_default=True, help="Engine steps in all.")
@click.option("--seed", "-s", type=int, default=0, show_default=True, help="Seed of the first run (runs count up).")
@click.option("--time", "time_s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Stop after this many seconds even if steps remain.")
@click.option("--arg", "arg", default="", help="Controller argument (text).")
@click.option("--capabilities", "-c", default="random", show_default=True,
              help="random (per run), all, none, or a list such as fork,ff-tokens.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=".aicirt-fuzz", show_default=True,
              help="Where a failure's reproducer file is written.")
@click.option("--no-shrink", is_flag=True, help="Report a failure as found, without shrinking it.")
@click.option("--replay", "replay_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Replay a reproducer file instead of fuzzing.")
def fuzz(controller: str | None, steps: int, seed: int, time_s: float | None, arg: str, capabilities: str,
         max_tokens: int, out_dir: str, no_shrink: bool, replay_file: str | None) -> None:
    """Fuzz a controller through a randomised, legal engine; exit 1 on a contract failure.

    \b
    Random tokens inside its masks, random capability grants, forks, splices, no-op and late
    steps, backtracks by the engine; every step checked. A failure is shrunk to a short trace
    and written to a reproducer file (replay it with --replay FILE).
    CONTROLLER is a .wasm file, a C/Zig file or folder, or a shipped controller's name.
    """
    from aicirt import AicirtError
    from aicirt.testing.command import fuzz_command, replay_command
    from aicirt.build.toolchain import BuildError

    try:
        if replay_file:
            sys.exit(replay_command(replay_file))
        if controller is None:
            raise click.UsageError("give a CONTROLLER (or --replay FILE)")
        sys.exit(fuzz_command(controller, steps=steps, seed=seed, time_s=time_s, arg=arg.encode(),
                              capabilities=capabilities, max_tokens=max_tokens, out_dir=out_dir,
                              shrink=not no_shrink))
    except (BuildError, AicirtError, ValueError) as e:
        raise click.ClickException(str(e)) from None


if __name__ == "__main__":
    sys.exit(main())
