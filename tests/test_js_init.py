"""aici.init: a bound script's per-tokenizer work is done once, by the init, and captured in its own
init snapshot (runtime/loader/js_bind.py, runtime/loader/snapshot.py, docs/js.md), so no request redoes it."""
from __future__ import annotations

import json

import pytest

import aicirt
from aicirt import StepInput
from aicirt.errors import LoadError
from aicirt.loader.js_bind import bind, runs_in_init
from aicirt.build.toolchain import build_cached

# Builds a table over the whole vocabulary (the kind of work a script wants done once). The
# virtual clock tells where that ran: it reads 0 in an init, and `calls` ms on a request's calls
# (1 on the first), docs/wasi.md.
SCRIPT = """
let built = 0, builtAt = -1, longest = 0;
const table = [];
aici.init(() => {
  built++;
  builtAt = Date.now();
  for (let t = 0; t < aici.vocabSize(); t++) {
    const b = aici.tokenBytes(t);
    table.push(b ? b.length : 0);
    if (b && b.length > longest) longest = b.length;
  }
});
function midProcess(arg) {
  aici.varSet("seen", JSON.stringify({built, builtAt, entries: table.length, longest, arg: aici.arg(),
                                      now: Date.now()}));
  return aici.stop();
}
"""


@pytest.fixture(scope="module")
def js_bytes():
    return build_cached("js").read_bytes()


def first_call(rt, ctrl, arg: bytes = b"") -> dict:
    req = rt.new_request(ctrl, arg)
    out = rt.submit([StepInput(req.spawn(), [1, 2])]).wait(30.0)
    assert out.results[0].status == "ok" and out.results[0].branches == [], out.results[0].error
    return json.loads(req.variables["seen"])


def test_a_bound_scripts_init_runs_once_per_tokenizer_in_its_own_snapshot(js_bytes):
    bound = bind(js_bytes, SCRIPT.encode())
    with aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False) as rt:
        js, ctrl = rt.load(js_bytes), rt.load(bound)
        assert ctrl.snapshot and ctrl.module is not js.module   # its own snapshot, not the js controller's
        for arg in (b"one", b"two", b"three"):   # every request starts from the init's table
            assert first_call(rt, ctrl, arg) == {"built": 1, "builtAt": 0, "entries": 257, "longest": 1,
                                                 "arg": arg.decode(), "now": 1}
        assert rt.load(bound).module is ctrl.module   # loaded again: the same snapshot, no init
    with aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False) as rt:
        # as the argument, the script is evaluated on each request's first call: aici.init runs there
        assert first_call(rt, rt.load(js_bytes), SCRIPT.encode() + b"\0x") == {
            "built": 1, "builtAt": 1, "entries": 257, "longest": 1, "arg": "x", "now": 1}


def test_a_bound_script_without_init_shares_the_js_controllers_snapshot(js_bytes):
    script = b"let t = aici.vocabSize(); function midProcess(a) { aici.varSet('seen', '{}'); return aici.stop(); }"
    assert not runs_in_init(script + b"\0")
    with aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False) as rt:
        assert rt.load(bind(js_bytes, script)).module is rt.load(js_bytes).module


def test_what_the_init_may_not_do_fails_the_load_with_its_reason(js_bytes):
    cases = {
        "aici.init(() => {}); const a = aici.arg(); function midProcess(x) {}":
            "aici.arg() is the request's",
        "aici.init(() => aici.varSet('x', 'y')); function midProcess(x) {}":
            "host import `var-set`, which init may not call",
        "aici.init(5); function midProcess(x) {}": "aici.init: expected a function, got",
        "aici.init(() => { throw new RangeError('no table'); }); function midProcess(x) {}":
            "RangeError: no table",
        "aici.init(() => {});": "defines no function midProcess",
    }
    with aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False) as rt:
        for script, needle in cases.items():
            with pytest.raises(LoadError, match="per-tokenizer init") as e:
                rt.load(bind(js_bytes, script.encode()))
            assert needle in str(e.value), (script, str(e.value))


def test_init_is_found_as_written():
    assert runs_in_init(b"aici . init ( () => 1 )\0whatever")
    assert runs_in_init(b'import {gen, init as once} from "@aicirt/aici";\0')
    assert not runs_in_init(b"aici.initialize = 1; function midProcess() {}\0")
    assert not runs_in_init(b"function midProcess() {}\0aici.init(")   # the request's own argument is no part
