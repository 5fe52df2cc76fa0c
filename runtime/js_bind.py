"""Binding a script to the js controller: `aicirt build ctrl.js`, `aicirt run ctrl.js` and
`aicirt upload ctrl.js` make one module (its own module id in the store) that runs that script,
so that the server and the vLLM plugin address it like any controller (docs/js.md).

The bound module is the js controller's module, unchanged, plus a custom section
``aicirt.arg-prefix`` holding the script and a NUL byte. Loading it (aicirt.controller) compiles
the module without that section — byte for byte the js controller, so its compiled code and its
init snapshot are the js controller's, from the caches: binding a script costs no compile — and
every request's argument is that prefix followed by the request's own argument, which is the
js controller's argument form (script, NUL, the script's argument: `aici.arg()`). The module's
id (sha256 of all its bytes) is still its own. Another host, which ignores custom sections, runs
it as the plain js controller: pass the script as the argument there.
"""
from __future__ import annotations

from .wasm_binary import WasmFormatError, _leb, _name, _Reader, sections

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
    body = _name(ARG_PREFIX_SECTION) + script + b"\0"
    return wasm + bytes([_SEC_CUSTOM]) + _leb(len(body)) + body


def split_arg_prefix(wasm: bytes) -> tuple[bytes, bytes]:
    """(the module without its ``aicirt.arg-prefix`` section, that section's bytes; b"" and the
    module unchanged when it has none). Raises WasmFormatError for a malformed module or more
    than one such section."""
    code, prefix, found = bytearray(wasm[:8]), b"", 0
    for sid, header, start, end in sections(wasm):
        if sid == _SEC_CUSTOM:
            r = _Reader(wasm, start, end)
            if r.name() == ARG_PREFIX_SECTION:
                found += 1
                prefix = wasm[r.pos:end]
                continue
        code += wasm[header:end]
    if found > 1:
        raise WasmFormatError(f"more than one {ARG_PREFIX_SECTION} section")
    return (bytes(code), prefix) if found else (wasm, b"")


# ---- checking a script, stripping TypeScript: both run inside the js controller itself ----------
TS_STRIPPER = "ts/sucrase.min.js"          # controllers/js/ts: Sucrase's typescript transform (README there)
_CHECK = b"""
function midProcess() {
  try {
    aici.varSet("module", String(aici._checkSyntax(aici.arg())));
  } catch (e) {
    aici.varSet("error", String(e && e.name) + ": " + String(e && e.message));
    aici.varSet("stack", String(e && e.stack));
  }
  return aici.stop();
}"""
_STRIP = b"""
function midProcess() {
  try {
    const a = aici.arg(), cut = a.indexOf("\\0");   // the stripper, NUL, the TypeScript
    (0, eval)(a.slice(0, cut));
    aici.varSet("js", stripTypes(a.slice(cut + 1), "script.ts"));
  } catch (e) {
    aici.varSet("error", String(e && e.message));
  }
  return aici.stop();
}"""


def _run_tool(tool: bytes, arg: bytes) -> dict[str, bytes]:
    """One call of the js controller running `tool` on `arg`; the variables it set. The tool runs in
    the Wasm sandbox like any request (byte tokenizer; the compiled js controller from the caches)."""
    from . import ByteTokenizer, Limits, Runtime, StepInput
    from .toolchain import build_cached
    limits = Limits(first_call_timeout_s=60.0, call_timeout_s=60.0, soft_deadline_s=60.0, compile_timeout_s=300.0)
    rt = Runtime(ByteTokenizer(), limits=limits, workers=1)
    try:
        req = rt.new_request(rt.load(build_cached("js", progress=False)), tool + b"\0" + arg)
        seq = req.spawn()
        r = rt.submit([StepInput(seq, [1], None)]).wait().results[0]
        if r.status != "ok":
            raise ValueError(f"the js controller could not run the check: {r.error}")
        return dict(req.variables)
    finally:
        rt.close()


def check_script(script: bytes, name: str = "<script>") -> None:
    """Parse `script` as the js controller will (a module when a line starts with import/export),
    running none of it. Raises ValueError "NAME:LINE:COL: SyntaxError: ..." for a script that
    does not parse."""
    got = _run_tool(_CHECK, script)
    if "error" in got:
        msg, stack = got["error"].decode(errors="replace"), got.get("stack", b"").decode(errors="replace")
        import re
        m = re.search(r"<script>:(\d+):(\d+)", stack)
        where = f"{name}:{m.group(1)}:{m.group(2)}" if m else name
        raise ValueError(f"{where}: {msg}")


def strip_types(ts: bytes, name: str = "<script>.ts") -> bytes:
    """TypeScript -> JavaScript with the types removed and every line where it was (Sucrase's
    typescript transform, controllers/js/ts). Raises ValueError "NAME:LINE:COL: ..." for source
    it cannot parse."""
    from .toolchain import CONTROLLERS_DIR
    stripper = (CONTROLLERS_DIR / "js" / TS_STRIPPER).read_bytes()
    got = _run_tool(_STRIP, stripper + b"\0" + ts)
    if "error" in got:
        import re
        msg = got["error"].decode(errors="replace").replace("Error transforming script.ts: ", "")
        m = re.search(r"\((\d+):(\d+)\)\s*$", msg)
        if m:
            msg = f"{int(m.group(1))}:{int(m.group(2))}: {msg[:m.start()].strip()}"
            raise ValueError(f"{name}:{msg}")
        raise ValueError(f"{name}: {msg}")
    return got["js"]
