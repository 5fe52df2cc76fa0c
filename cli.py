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
      aicirt run regex --arg '[0-9]{3}-[0-9]{4}' --prompt 'Call me at '
    """


# --- build (owned by the SDK/toolchain work) ---------------------------------------------------
@main.command()
def build() -> None:
    """Compile a C file, Zig file or controller folder to a controller module."""
    raise click.ClickException("not implemented yet")


# --- run (owned by the engine work) --------------------------------------------------------------
@main.command()
def run() -> None:
    """Run a controller on a model and stream what it generates."""
    raise click.ClickException("not implemented yet")


if __name__ == "__main__":
    sys.exit(main())
