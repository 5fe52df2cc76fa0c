"""Binding a script into the js controller's module: `aicirt build ctrl.js`, `aicirt run ctrl.js`
and `aicirt upload ctrl.js` make one module (its own module id in the store) that runs that
script, so that the server and the vLLM plugin address it like any controller (docs/js.md).

The js glue holds a marker struct (``bound_script``: 24 bytes of magic, then ptr and len, both
0) in a data segment. :func:`bind` appends the script as an active data segment at the end of
the module's initial memory (the memory's minimum grows to cover it: the allocators only ever
take pages past the current size, so they never reach it), and writes its address and length
into the marker. The controller argument is then entirely the script's own (`aici.arg()`).
"""
from __future__ import annotations

import struct

from .wasm_binary import WASM_PAGE, WasmFormatError, _leb, _Reader, _skip_const_expr, _sleb, sections

MARKER = b"aicirt:js:bound-script!\0"
_SEC_MEMORY, _SEC_DATA, _SEC_DATA_COUNT = 5, 11, 12
MAX_SCRIPT_BYTES = 16 << 20


def bind(wasm: bytes, script: bytes) -> bytes:
    """The js controller `wasm` with `script` bound in. Raises ValueError for a script that is
    empty, not UTF-8 or over 16 MiB, WasmFormatError for a module that is not the js controller
    (no marker) or already has a script."""
    if not script.strip():
        raise ValueError("the script is empty")
    if len(script) > MAX_SCRIPT_BYTES:
        raise ValueError(f"the script is {len(script)} bytes, over the limit of {MAX_SCRIPT_BYTES}")
    try:
        script.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"the script is not UTF-8 (byte {e.start})") from None
    secs = {sid: (header, start, end) for sid, header, start, end in sections(wasm)}
    if _SEC_MEMORY not in secs or _SEC_DATA not in secs:
        raise WasmFormatError("not the js controller: no memory or no data")
    at = wasm.find(MARKER, secs[_SEC_DATA][1], secs[_SEC_DATA][2])
    if at < 0 or wasm.find(MARKER, at + 1) >= 0:
        raise WasmFormatError("not the js controller: no (single) bound-script marker in its data")
    ptr, n = struct.unpack_from("<II", wasm, at + len(MARKER))
    if ptr or n:
        raise WasmFormatError("this js module already has a script bound in")
    r = _Reader(wasm, secs[_SEC_MEMORY][1], secs[_SEC_MEMORY][2])
    if r.leb(32) != 1:
        raise WasmFormatError("not the js controller: not exactly one memory")
    flags = r.byte()
    if flags & ~0x01:
        raise WasmFormatError("not the js controller: a shared or 64-bit memory")
    pages = r.leb(32)
    max_pages = r.leb(32) if flags & 1 else None
    addr = pages * WASM_PAGE
    new_pages = pages + -(-len(script) // WASM_PAGE)
    if max_pages is not None and new_pages > max_pages:
        raise WasmFormatError(f"the script does not fit under the memory's maximum of {max_pages} pages")
    patched = bytearray(wasm)
    struct.pack_into("<II", patched, at + len(MARKER), addr, len(script))
    out = bytearray(patched[:8])
    for sid, header, start, end in sections(bytes(patched)):
        body = bytes(patched[start:end])
        if sid == _SEC_MEMORY:
            body = _leb(1) + bytes([flags]) + _leb(new_pages) + (_leb(max_pages) if max_pages is not None else b"")
        elif sid == _SEC_DATA_COUNT:
            body = _leb(_Reader(body).leb(32) + 1)
        elif sid == _SEC_DATA:
            dr = _Reader(body)
            count = dr.leb(32)
            for _ in range(count):   # check the segments parse (the marker must lie in one)
                f = dr.leb(32)
                if f == 2:
                    dr.leb(32)
                if f != 1:
                    _skip_const_expr(dr)
                dr.take(dr.leb(32))
            i32 = addr - (1 << 32) if addr >= 1 << 31 else addr
            seg = b"\x00\x41" + _sleb(i32) + b"\x0b" + _leb(len(script)) + script   # active, i32.const addr
            body = _leb(count + 1) + body[_leb_len(body):] + seg
        out += bytes([sid]) + _leb(len(body)) + body
    return bytes(out)


def _leb_len(data: bytes) -> int:
    r = _Reader(data)
    r.leb(32)
    return r.pos
