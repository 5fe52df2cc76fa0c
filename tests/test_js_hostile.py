"""JS variants of the hostile suite (tests/hostile/js_kinds.py): each misbehaving script runs in
the js controller beside healthy sequences; the healthy outputs must equal
what they produce alone, and the hostile sequence must end with a one-line message naming the
cause (time limit, out of memory, stack, wrong shape, ...)."""
from __future__ import annotations

import pytest
from hostile.js_kinds import JS_KINDS, JsKind
from hostile.runner import Spec, healthy_specs, run_batch

import aicirt
from aicirt.build import toolchain

SUITE_LIMITS = {"call_timeout_s": 0.25, "first_call_timeout_s": 0.25}


@pytest.fixture(scope="module")
def js_wasm():
    return toolchain.build_cached("js")


@pytest.fixture(scope="module")
def alone(scripted_wasm):
    with aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False) as rt:
        return run_batch(rt, healthy_specs(scripted_wasm)).healthy


@pytest.mark.timing
@pytest.mark.parametrize("kind", JS_KINDS, ids=lambda k: k.name)
def test_js_hostile_beside_healthy(make_rt, scripted_wasm, js_wasm, alone, kind: JsKind):
    rt = make_rt(**{**SUITE_LIMITS, **kind.limits})
    spec = Spec(js_wasm, kind.script.encode() + b"\0", prompt=(65, 66))
    out = run_batch(rt, healthy_specs(scripted_wasm), spec, settle=kind.expect.startswith("error: "))
    assert out.healthy == alone, f"healthy sequences changed beside {kind.name}"
    assert out.hostile, "no hostile sequence ran"
    if kind.expect == "legal":
        assert all(reason != "error" for reason, _ in out.hostile), out.hostile
        return
    needles = kind.expect[len("error: "):].split("|")
    for reason, err in out.hostile:
        assert reason == "error", f"{kind.name}: expected an error, got {reason} ({err})"
        assert any(n in err for n in needles), f"{kind.name}: {err!r} does not say {' or '.join(needles)!r}"
        assert "\n" not in err.strip() and len(err) < 400, f"not a one-line message: {err!r}"
