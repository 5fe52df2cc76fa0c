"""The child process that compiles a controller, so a compile past the time limit can be killed.

A compile cannot be interrupted in-process (a thread left running kept both cores and GBs busy
for minutes after the upload was refused), so :func:`aicirt.loader.controller.load_controller` runs
this file as a script (`python -I compile_worker.py`) and kills it at the deadline. It imports
only wasmtime and the two parsing modules beside it, not the aicirt package (~0.3 s less).

Protocol: stdin is a u32 header length, a JSON header (the engine settings that compiled code
depends on), then the module bytes. stdout is b"K" + the serialized module, or b"E" + a message.
"""
from __future__ import annotations

import json
import struct
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import types


def _parsers() -> types.ModuleType:
    """wasm_code without running aicirt's __init__: a bare package over this directory."""
    import pathlib
    import types
    name = "_aicirt_loader"
    if name not in sys.modules:
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(pathlib.Path(__file__).resolve().parent)]
        sys.modules[name] = pkg
    return __import__(f"{name}.wasm_code", fromlist=["fork_unsafe_instruction"])


def compile_module(header: dict, wasm: bytes) -> bytes:
    """The serialized module, or b"E" + why it is refused."""
    import wasmtime
    try:
        unsafe = _parsers().fork_unsafe_instruction(wasm)
    except ValueError as e:          # WasmFormatError
        return b"E" + str(e).encode()
    if unsafe:
        return b"E" + unsafe.encode()
    cfg = wasmtime.Config()
    cfg.epoch_interruption = header["epoch_interruption"]
    if header.get("memory_reservation") is not None:
        cfg.memory_reservation = header["memory_reservation"]
        cfg.memory_guard_size = header["memory_guard_size"]
    try:
        return b"K" + wasmtime.Module(wasmtime.Engine(cfg), wasm).serialize()
    except Exception as e:           # wasmtime's validation message, reported by the parent
        return b"E" + ("not a valid Wasm module: " + str(e).strip()).encode()


def main() -> None:
    data = sys.stdin.buffer.read()
    (n,) = struct.unpack_from("<I", data)
    header = json.loads(data[4:4 + n])
    sys.stdout.buffer.write(compile_module(header, data[4 + n:]))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
