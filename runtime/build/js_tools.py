"""Tools that run inside the js controller, for the CLI and the build: a script's syntax check
(`check_script`: `aicirt build/check/upload x.js` report a syntax error with its line and column)
and TypeScript's type stripping (`strip_types`: `aicirt run/build/upload x.ts`). Each is one call
of the js controller in the Wasm sandbox (docs/js.md), so no Node is needed."""
from __future__ import annotations

import re

from ..limits import Limits
from ..core.results import StepInput
from ..core.runtime import Runtime
from ..host.tokenizer import ByteTokenizer

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


def _run_tool(js: bytes, tool: bytes, arg: bytes) -> dict[str, bytes]:
    """One call of the js controller (`js`, its module) running `tool` on `arg`; the variables it set. The tool runs in
    the Wasm sandbox like any request (byte tokenizer; the compiled js controller from the caches)."""
    limits = Limits(first_call_timeout_s=60.0, call_timeout_s=60.0, soft_deadline_s=60.0, compile_timeout_s=300.0)
    rt = Runtime(ByteTokenizer(), limits=limits, workers=1)
    try:
        req = rt.new_request(rt.load(js), tool + b"\0" + arg)
        seq = req.spawn()
        r = rt.submit([StepInput(seq, [1], None)]).wait().results[0]
        if r.status != "ok":
            raise ValueError(f"the js controller could not run the check: {r.error}")
        return dict(req.variables)
    finally:
        rt.close()


def check_script(js: bytes, script: bytes, name: str = "<script>") -> None:
    """Parse `script` as the js controller will (a module when a line starts with import/export),
    running none of it. Raises ValueError "NAME:LINE:COL: SyntaxError: ..." for a script that
    does not parse."""
    got = _run_tool(js, _CHECK, script)
    if "error" in got:
        msg, stack = got["error"].decode(errors="replace"), got.get("stack", b"").decode(errors="replace")
        m = re.search(r"<script>:(\d+):(\d+)", stack)
        where = f"{name}:{m.group(1)}:{m.group(2)}" if m else name
        raise ValueError(f"{where}: {msg}")


def strip_types(js: bytes, stripper: bytes, ts: bytes, name: str = "<script>.ts") -> bytes:
    """TypeScript -> JavaScript with the types removed and every line where it was (Sucrase's
    typescript transform, controllers/js/ts). Raises ValueError "NAME:LINE:COL: ..." for source
    it cannot parse."""
    got = _run_tool(js, _STRIP, stripper + b"\0" + ts)
    if "error" in got:
        msg = got["error"].decode(errors="replace").replace("Error transforming script.ts: ", "")
        m = re.search(r"\((\d+):(\d+)\)\s*$", msg)
        if m:
            msg = f"{int(m.group(1))}:{int(m.group(2))}: {msg[:m.start()].strip()}"
            raise ValueError(f"{name}:{msg}")
        raise ValueError(f"{name}: {msg}")
    return got["js"]
