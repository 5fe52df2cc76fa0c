"""Binding a script to the js controller: `aicirt build ctrl.js`, `aicirt run ctrl.js` and
`aicirt upload ctrl.js` make one module (its own module id in the store) that runs that script,
so that the server and the vLLM plugin address it like any controller (docs/js.md).

The bound module is the js controller's module, unchanged, plus a custom section
``aicirt.arg-prefix`` holding the script and a NUL byte. Loading it (aicirt.loader.controller) compiles
the module without that section — byte for byte the js controller, so its compiled code and its
init snapshot are the js controller's, from the caches: binding a script costs no compile — and
every request's argument is that prefix followed by the request's own argument, which is the
js controller's argument form (script, NUL, the script's argument: `aici.arg()`). The module's
id (sha256 of all its bytes) is still its own. Another host, which ignores custom sections, runs
it as the plain js controller: pass the script as the argument there.

A bound script that calls ``aici.init(fn)`` (:func:`runs_in_init`) is the exception: its init
snapshot is its own (keyed by the module id, not the code's), made by an init that gets the script
as ``arg`` and evaluates it, so its top level and ``fn`` run once per tokenizer and every request
starts from what they built (one compile of the snapshot per script and tokenizer, cached).
"""
from __future__ import annotations

import re

from .wasm_binary import Reader, WasmFormatError, leb, name_bytes, sections

ARG_PREFIX_SECTION = "aicirt.arg-prefix"
MARKER = b"aicirt:js:controller:1\0"   # in the js controller's data (controllers/js/main.c)
MAX_SCRIPT_BYTES = 16 << 20
_SEC_CUSTOM, _SEC_DATA = 0, 11


def bind(wasm: bytes, script: bytes) -> bytes:
    """The js controller `wasm` with `script` bound in. Raises ValueError for a script that is
    empty, not UTF-8, holds a NUL byte or is over 16 MiB, WasmFormatError for a module that is not
    the js controller or already has a script."""
    if not script.strip():
        raise ValueError("the script is empty")
    if len(script) > MAX_SCRIPT_BYTES:
        raise ValueError(f"the script is {len(script)} bytes, over the limit of {MAX_SCRIPT_BYTES}")
    try:
        script.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"the script is not UTF-8 (byte {e.start})") from None
    if b"\0" in script:
        raise ValueError(f"the script holds a NUL byte (byte {script.index(0)}): NUL ends a script")
    data = [(start, end) for sid, _, start, end in sections(wasm) if sid == _SEC_DATA]
    if not data or wasm.find(MARKER, *data[0]) < 0:
        raise WasmFormatError("not the js controller (no js controller marker in its data)")
    if split_arg_prefix(wasm)[1]:
        raise WasmFormatError("this module already has a script bound in")
    body = name_bytes(ARG_PREFIX_SECTION) + script + b"\0"
    return wasm + bytes([_SEC_CUSTOM]) + leb(len(body)) + body


def split_arg_prefix(wasm: bytes) -> tuple[bytes, bytes]:
    """(the module without its ``aicirt.arg-prefix`` section, that section's bytes; b"" and the
    module unchanged when it has none). Raises WasmFormatError for a malformed module or more
    than one such section."""
    code, prefix, found = bytearray(wasm[:8]), b"", 0
    for sid, header, start, end in sections(wasm):
        if sid == _SEC_CUSTOM:
            r = Reader(wasm, start, end)
            if r.name() == ARG_PREFIX_SECTION:
                found += 1
                prefix = wasm[r.pos:end]
                continue
        code += wasm[header:end]
    if found > 1:
        raise WasmFormatError(f"more than one {ARG_PREFIX_SECTION} section")
    return (bytes(code), prefix) if found else (wasm, b"")


# ---- checking a script, stripping TypeScript: both run inside the js controller itself ----------


# `aici.init(`, or `init` imported from the library (an ES module script)
_INIT_CALL = re.compile(rb"\baici\s*\.\s*init\s*\(")
_INIT_IMPORT = re.compile(rb"\bimport\s*\{[^}]*\binit\b[^}]*\}\s*from\s*[\"'](?:aici|@aicirt/aici)[\"']")


def runs_in_init(arg_prefix: bytes) -> bool:
    """Whether a bound script (a module's arg-prefix: script, NUL) is evaluated by the init: it
    calls ``aici.init`` (as the text reads: a call through another name is not seen, and then
    ``aici.init``'s function runs on each request's first call, as for a script given as the
    argument)."""
    script = arg_prefix.split(b"\0", 1)[0]
    return bool(_INIT_CALL.search(script) or _INIT_IMPORT.search(script))
