"""The hostile suite (issue 10 item 4): every kind in tests/hostile/kinds.py runs in one batch
beside healthy sequences; the healthy outputs must equal what they produce
alone, and the hostile sequence must end as its kind says (with a message naming the fault)."""
from __future__ import annotations

import pytest
from hostile.kinds import HERE, KINDS, Kind
from hostile.runner import Spec, healthy_specs, run_batch

import aicirt
from aicirt import StepInput
from aicirt.build import toolchain

# Short hard limits keep the suite quick; the soft deadline and late-step count are the defaults.
SUITE_LIMITS = {"call_timeout_s": 0.25, "first_call_timeout_s": 0.25}


@pytest.fixture(scope="session")
def hostile_c_wasm():
    return toolchain.build_cached(HERE / "hostile.c")


@pytest.fixture(scope="module")
def alone(scripted_wasm):
    """Each healthy sequence's output when it runs with nothing beside it (plain runtime)."""
    with aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False) as rt:
        out = run_batch(rt, healthy_specs(scripted_wasm))
    assert all(reason in ("stop", "length", "eos") for _, reason, _ in out.healthy.values()), out.healthy
    assert len(out.healthy) == 3      # regex, scripted, and the scripted one's fork
    return out.healthy


def _param(kind: Kind):
    marks = [pytest.mark.xfail(strict=True, reason=kind.xfail)] if kind.xfail else []
    return pytest.param(kind, id=kind.name, marks=marks)


def test_the_suite_has_at_least_40_kinds():
    assert len({k.name for k in KINDS}) == len(KINDS) >= 40


@pytest.mark.timing   # hard limits, soft deadlines and extra workers: `make test-busy` runs it under load
@pytest.mark.parametrize("kind", [_param(k) for k in KINDS])
def test_hostile_beside_healthy(make_rt, scripted_wasm, hostile_c_wasm, alone, kind: Kind):
    rt = make_rt(**{**SUITE_LIMITS, **kind.limits})
    spec = Spec(kind.wasm if kind.wasm is not None else hostile_c_wasm, kind.arg, capabilities=kind.capabilities)
    if kind.expect.startswith("load: "):
        with pytest.raises(aicirt.LoadError, match=_literal(kind.expect[6:])):
            rt.load(spec.wasm)
        out = run_batch(rt, healthy_specs(scripted_wasm))   # it never loaded: the healthy run as usual
    else:
        # A hostile sequence that must end in error is stepped until it does: with hard limits in
        # CPU time, a looper may outlive the healthy sequences on a busy machine.
        out = run_batch(rt, healthy_specs(scripted_wasm), spec, copies=kind.copies, respawn=kind.respawn,
                        wait_hostile=kind.wait_hostile, take_var_changes=kind.take_var_changes,
                        settle=kind.settle or kind.expect.startswith("error: "))
    assert out.healthy == alone, f"healthy sequences changed beside {kind.name}"
    _check_hostile(kind, out.hostile)
    if kind.not_held_up:
        assert out.stuck_at_healthy_end, (f"the healthy sequences finished only after every hostile call had ended "
                                          f"({out.steps} steps, {out.elapsed_s:.2f} s): held up by {kind.name}")
    if kind.cpu_s is not None:
        assert out.cpu_s < kind.cpu_s, (f"the batch used {out.cpu_s:.2f} s of CPU (limit {kind.cpu_s} s; "
                                        f"{out.elapsed_s:.2f} s wall-clock, worst step {out.worst_step_s:.2f} s)")
    print(f"{kind.name}: {out.steps} steps, {out.elapsed_s:.3f} s wall-clock, {out.cpu_s:.3f} s CPU, "
          f"{out.stuck_at_healthy_end} hostile calls out at the healthy end")


def _literal(text: str) -> str:
    import re
    return re.escape(text)


def _check_hostile(kind: Kind, hostile: list[tuple]) -> None:
    assert hostile or kind.expect.startswith("load: "), "no hostile sequence ran"
    if kind.expect == "any" or kind.expect.startswith("load: "):
        return
    if kind.expect == "legal":
        assert all(reason != "error" for reason, _ in hostile), hostile
        return
    if kind.expect.startswith("spawn: "):
        assert all(reason == "error" and kind.expect[7:] in (err or "") for reason, err in hostile), hostile
        return
    needles = kind.expect[len("error: "):].split("|")
    for reason, err in hostile:
        assert reason == "error", f"{kind.name}: expected an error, got {reason} ({err})"
        assert any(n in err for n in needles), f"{kind.name}: {err!r} does not say {' or '.join(needles)!r}"
        assert "\n" not in err.strip() and len(err) < 400, f"not a one-line message: {err!r}"


def _rss_kb() -> int:
    from pathlib import Path
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(status["VmRSS"].split()[0])


def test_faults_inside_host_imports_do_not_leak(make_rt):
    """Issue 10 item 2: about 1.7 KB leaked per sequence that faulted inside a host import."""
    import gc

    from hostile.wat import module
    rt = make_rt(**SUITE_LIMITS)
    ctrl = rt.load(module("(call $log (i32.const -16) (i32.const 100))", imports=("log",)))

    def fault(n: int) -> None:
        for _ in range(n // 50):
            seqs = [rt.new_request(ctrl).spawn() for _ in range(50)]
            out = rt.submit([StepInput(s, [1]) for s in seqs]).wait()
            assert all(r.status == "error" and "host import `log`" in r.error for r in out.results)
            for s in seqs:
                s.close()
    window = 1500                 # the leak was ~2.8 MB a window; the bound allows 0.3 MB
    fault(window)                 # warm-up: pools, caches, allocator arenas (a one-off ~1-3 MB)
    rss = []
    for _ in range(3):
        gc.collect()
        rss.append(_rss_kb())
        fault(window)
    gc.collect()
    rss.append(_rss_kb())
    # the slope, not one step: the smallest growth of three windows (an arena may grow once)
    per_sequence = min(b - a for a, b in zip(rss, rss[1:])) * 1024 / window
    assert per_sequence < 200, f"{per_sequence:.0f} bytes of RSS per faulting sequence ({rss} KB)"   # was ~1,900
