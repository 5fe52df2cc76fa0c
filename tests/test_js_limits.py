"""The js controller at the runtime's limits, with JS context (issue 30): a time-out names the JS
frames where the script was (the host's time notice, docs/protocol.md#limits, interrupts the
interpreter before the hard limit would end the call), and a neighbour sequence is unharmed; memory
filled gradually is the catchable InternalError under the default limits, and a script that
catches it goes on."""
from __future__ import annotations

import re

import pytest
from hostile.runner import Spec, healthy_specs, run_batch
from test_js_hostile import SUITE_LIMITS, alone, js_wasm  # noqa: F401  (fixtures: the suite's healthy run alone)


def _hostile_error(make_rt, scripted_wasm, js_wasm, alone, script: str) -> str:
    rt = make_rt(**SUITE_LIMITS)
    spec = Spec(js_wasm, script.encode() + b"\0", prompt=(65, 66))
    out = run_batch(rt, healthy_specs(scripted_wasm), spec, settle=True)
    assert out.healthy == alone, "the healthy sequences changed beside the looping script"
    assert [reason for reason, _ in out.hostile] == ["error"], out.hostile
    return out.hostile[0][1]


# (script, the frames its error must name, innermost first)
TIMEOUTS = {
    "midProcess": ("function spin(n) {\n  for (;;) n++;\n}\n"
                   "function midProcess(arg) {\n  if (arg.callIndex > 0) spin(0);\n"
                   "  return aici.sample(new aici.TokenSet([65, 66]));\n}\n",
                   [("spin", 2), ("midProcess", 5)]),
    "first-call": ("function build() {\n  const t = [];\n  let i = 0;\n  while (true) { t[i & 1023] = i; i++; }\n}\n"
                   "build();\nfunction midProcess(arg) { return aici.stop(); }\n",
                   [("build", 4), ("<eval>", 6)]),
    "library": ("aici.start(async () => {\n  await $`x`;\n  let n = 0;\n  while (true) { n += Math.sqrt(n); }\n});\n",
                [("<anonymous>", 4)]),
    "regex": ("function midProcess(arg) {\n  return /^(a+)+$/.test('a'.repeat(40) + 'b') ? aici.stop() : aici.noop();\n}\n",
              [("midProcess", 2)]),
}


@pytest.mark.timing
@pytest.mark.parametrize("name", TIMEOUTS)
def test_a_time_out_names_the_js_frames(make_rt, scripted_wasm, js_wasm, alone, name):
    script, frames = TIMEOUTS[name]
    err = _hostile_error(make_rt, scripted_wasm, js_wasm, alone, script)
    assert "time limit interrupted the script: InternalError: interrupted" in err, err
    found = re.findall(r"at (\S+) \(<script>:(\d+)", err)
    assert [(f, int(line)) for f, line in found[:len(frames)]] == frames, err


# Gradual out-of-memory under the default time limits (1 s of CPU for the first call; the soft
# deadline, wall-clock, only says how long each step is waited for here): what
# fills the heap, small objects (where the InternalError itself used to find no room, so `null`
# was thrown) and large arrays. The script catches the error, lets go of the memory and goes on:
# more steps, each allocating again.
FILLERS = {"small objects": "{a: n, b: [n]}", "strings": "'x'.repeat(100) + n",
           "1000-element arrays": "new Array(1000).fill(1.5)"}


@pytest.mark.parametrize("filler", FILLERS)
def test_gradual_out_of_memory_is_a_catchable_internal_error(make_rt, filler):
    from test_js import run_js
    script = f"""
    let keep = [], n = 0, caught;
    function midProcess(arg) {{
      if (arg.callIndex === 0) {{
        try {{
          for (;;) {{ keep.push({FILLERS[filler]}); n++; }}
        }} catch (e) {{
          keep = [];
          caught = (e instanceof InternalError) + " " + String(e) + " after " + n;
        }}
      }} else {{
        keep.push(new Array(1000).fill(arg.callIndex));   // the heap works again
      }}
      console.log(caught, keep.length);
      return arg.callIndex < 3 ? aici.sample(new aici.TokenSet([65])) : aici.stop();
    }}"""
    results, log = run_js(script, steps=5, hot_path_rt=make_rt(soft_deadline_s=30.0))   # wall: a busy machine
    assert [r.status for r in results] == ["ok"] * 4, (results[-1].error, log)
    assert results[-1].branches == []
    lines = log.strip().splitlines()
    assert len(lines) == 4 and all(line.startswith("true InternalError: out of memory after ") for line in lines), log
    assert int(lines[0].split()[-2]) > 1000, log     # it did fill the heap
    assert [line.split()[-1] for line in lines] == ["0", "1", "2", "3"], log


def test_gradual_out_of_memory_uncaught_ends_the_sequence_with_its_line(make_rt):
    from test_js import run_js
    script = "const keep = [];\nfunction midProcess(arg) {\n  for (;;) keep.push({a: [1]});\n}\n"
    results, log = run_js(script, hot_path_rt=make_rt(soft_deadline_s=30.0))
    assert results[0].status == "error", results[0]
    assert "js: midProcess threw: InternalError: out of memory | at midProcess (<script>:3:" in results[0].error
