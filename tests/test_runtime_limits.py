"""docs/protocol.md#limits limits and invalid results: each ends only the offending sequence, with a clear message."""
from __future__ import annotations

import time

import pytest
from conftest import mask_tokens
from scripted import (bad_host_ptr, bad_result_ptr, branch, grow, log, loop_forever, recurse, result, script, var_set,
                      spin, splice, trap)

import aicirt
from aicirt import StepInput

HEALTHY = result(branch(mask=[65]))


def run_beside_healthy(runtime, wasm, *bad_steps, tokens=(1, 2), timeout_s=None):
    """Submit a misbehaving sequence next to a healthy one; returns (bad result, healthy outcome)."""
    ctrl = runtime.load(wasm)
    bad = runtime.new_request(ctrl, arg=script(*bad_steps)).spawn()
    good = runtime.new_request(ctrl, arg=script(HEALTHY)).spawn()
    healthy_done = False
    for _ in range(400):   # a slow first call is pending (it never holds up the healthy one) until it ends
        items = [StepInput(bad, list(tokens), None)]
        if not healthy_done:
            items.append(StepInput(good, list(tokens), None))
        out = runtime.submit(items).wait(timeout_s)
        b = out.results[0]
        if not healthy_done:
            g = out.results[1]
            assert g.status in ("ok", "pending"), g.error   # pending only if the machine is very busy
            if g.status == "ok":
                assert mask_tokens(out, g.branches[0].mask_row) == [65]
                healthy_done = True
        if b.status != "pending" and healthy_done:
            break
    return b, bad


@pytest.mark.parametrize("steps, needle", [
    ((trap(),), "unreachable"),
    ((bad_result_ptr(),), "outside linear memory"),
    ((result(branch(raw_mask=[1, 2])),), "mask has 2 words, expected ceil(257/32) = 9"),
    ((result(branch(raw_mask=[0] * 8 + [2])),), "token 257 >= vocab size 257"),
    ((result(branch(raw_mask=[0] * 9)),), "mask allows no token"),
    ((result(branch(mask=[1], splices=[splice(ff=[300])])),), "token id 300 >= vocab size 257"),
    ((result(branch(mask=[1], splices=[splice(when=[999], ff=[1])])),), "token id 999"),
    ((result(branch()),), "exactly one unconditional splice"),
    ((result(branch(splices=[splice(when=[1], ff=[1])])),), "exactly one unconditional splice"),
    ((result(branch(mask=[1], temperature=float("nan"))),), "temperature"),
    ((bad_host_ptr(HEALTHY),), "host import `log`: range"),
])
def test_invalid_results_end_only_that_sequence(rt, scripted_wasm, steps, needle):
    r, seq = run_beside_healthy(rt, scripted_wasm, *steps)
    assert r.status == "error" and needle in r.error, r.error
    assert seq.finished


def test_first_call_time_limit(make_rt, scripted_wasm):
    runtime = make_rt(first_call_timeout_s=0.2, call_timeout_s=30)
    r, _ = run_beside_healthy(runtime, scripted_wasm, loop_forever())
    assert r.status == "error" and "time limit" in r.error
    assert "s of CPU in its first call, over its time limit of 0.2 s (Limits.first_call_timeout_s)" in r.error, r.error


def test_call_time_limit_interrupts_an_endless_loop(make_rt, scripted_wasm):
    # many late steps allowed: the call limit (0.2 s of CPU), not lateness, must end it
    runtime = make_rt(first_call_timeout_s=30, call_timeout_s=0.2, soft_deadline_s=0.01, max_late_steps=100_000)
    req = runtime.new_request(runtime.load(scripted_wasm), arg=script(HEALTHY, loop_forever()))
    seq = req.spawn()
    assert runtime.submit([StepInput(seq, [1], None)]).wait(1.0).results[0].status == "ok"   # the quick first call
    statuses = []
    while not seq.finished:   # ends at 0.2 s of CPU (or the backstop: 2 s of wall-clock time)
        statuses.append(runtime.submit([StepInput(seq, [1, 65], 65)]).wait(0.05).results[0])
    assert statuses[0].status == "pending" and statuses[-1].status == "error"
    assert "time limit" in statuses[-1].error and "(Limits.call_timeout_s)" in statuses[-1].error, statuses[-1].error


def test_fork_without_a_free_instance_slot(hot_path, scripted_wasm):
    with aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False, max_sequences=2) as runtime:
        ctrl = runtime.load(scripted_wasm)
        seq = runtime.new_request(ctrl, arg=script(result(*[branch(mask=[i]) for i in range(3)]))).spawn()
        other = runtime.new_request(ctrl, arg=script(HEALTHY)).spawn()
        out = runtime.submit([StepInput(seq, [1], None), StepInput(other, [1], None)]).wait()
        assert out.results[0].status == "error" and "fork failed" in out.results[0].error
        assert out.results[1].status == "ok"
        with pytest.raises(aicirt.ControllerError, match="instantiating"):
            runtime.new_request(ctrl).spawn() and runtime.new_request(ctrl).spawn()


def test_memory_limit(make_rt, scripted_wasm):
    runtime = make_rt(memory_bytes=2 << 20)
    r, _ = run_beside_healthy(runtime, scripted_wasm, grow(64, HEALTHY))   # 4 MiB more than allowed
    assert r.status == "error" and "unreachable" in r.error


def test_stack_limit(make_rt, scripted_wasm):
    runtime = make_rt(stack_bytes=64 << 10)
    r, _ = run_beside_healthy(runtime, scripted_wasm, recurse(100000, HEALTHY))
    assert r.status == "error" and ("stack" in r.error or "out of bounds" in r.error), r.error


def test_too_many_forks(make_rt, scripted_wasm):
    runtime = make_rt(max_forks=2)
    r, _ = run_beside_healthy(runtime, scripted_wasm, result(*[branch(mask=[i]) for i in range(4)]))
    assert r.status == "error" and "limit of 2 forks" in r.error


def test_log_is_capped_oldest_dropped(make_rt, scripted_wasm):
    runtime = make_rt(log_bytes=16)
    req = runtime.new_request(runtime.load(scripted_wasm), arg=script(log("0123456789abcdefXYZ", HEALTHY)))
    seq = req.spawn()
    r = runtime.submit([StepInput(seq, [1], None)]).wait().results[0]
    assert r.status == "ok" and r.logs == "3456789abcdefXYZ" and bytes(seq.log) == b"3456789abcdefXYZ"


def test_soft_deadline_then_late_result_next_step(make_rt, scripted_wasm):
    runtime = make_rt(soft_deadline_s=0.001, first_call_timeout_s=0.5, max_late_steps=100)
    ctrl = runtime.load(scripted_wasm)
    # call 1 (prompt) is quick; call 2 busy-loops (tens of ms: far slower than 1 ms; 5M rounds took
    # 3-7 ms here, so that a caller preempted that long between submit and wait saw it done)
    slow = spin(50_000_000, result(branch(mask=[66])))
    req = runtime.new_request(ctrl, arg=script(HEALTHY, slow))
    seq = req.spawn()
    assert runtime.submit([StepInput(seq, [1], None)]).wait(1.0).results[0].status == "ok"   # the quick first call
    first = runtime.submit([StepInput(seq, [1, 65], 65)]).wait().results[0]
    assert first.status == "pending"
    results = []
    for _ in range(90):
        out = runtime.submit([StepInput(seq, [1, 65], None)]).wait(0.05)
        results.append(out.results[0])
        if out.results[0].status != "pending":
            break
    final = results[-1]
    assert final.status == "ok" and mask_tokens(out, final.branches[0].mask_row) == [66]


def test_too_many_late_steps_is_an_error(make_rt, scripted_wasm):
    runtime = make_rt(soft_deadline_s=0.001, max_late_steps=3, call_timeout_s=0.5, first_call_timeout_s=0.5)
    req = runtime.new_request(runtime.load(scripted_wasm), arg=script(HEALTHY, loop_forever()))
    seq = req.spawn()
    assert runtime.submit([StepInput(seq, [1], None)]).wait(1.0).results[0].status == "ok"
    statuses: list[str] = []
    for _ in range(20):   # a step only counts once the call has started on a worker
        statuses.append(runtime.submit([StepInput(seq, [1, 65], 65)]).wait(0.001).results[0].status)
        if statuses[-1] != "pending":
            break
    assert statuses[-1] == "error" and len(statuses) >= 3 and set(statuses[:-1]) == {"pending"}, statuses
    assert "late 3 steps" in seq.error


def test_initial_memory_over_the_limit_is_refused_at_load(make_rt, scripted_wasm):
    runtime = make_rt(memory_bytes=1)   # not even the initial memory fits
    with pytest.raises(aicirt.LoadError, match="memory"):
        runtime.load(scripted_wasm)
        runtime.new_request(runtime.load(scripted_wasm)).spawn()


def test_compile_time_limit(make_rt, scripted_wasm):
    runtime = make_rt(compile_timeout_s=1e-6)
    # a custom section makes it a module this process has not compiled (and cached) before
    fresh = scripted_wasm.read_bytes() + b"\x00\x09\x04seed" + time.time_ns().to_bytes(8, "little")[:4]
    with pytest.raises(aicirt.LoadError, match="compiling took longer than"):
        runtime.load(fresh)


def test_host_argument_limit(make_rt, scripted_wasm):
    runtime = make_rt(host_arg_bytes=64)    # the scripted controller's own trace entries are 32 bytes
    r, _ = run_beside_healthy(runtime, scripted_wasm, log("x" * 100, HEALTHY))
    assert r.status == "error" and "host import `log`: an argument of 100 bytes is over the limit of 64" in r.error


def test_variable_limit(make_rt, scripted_wasm):
    # variables count what host.c allocates for them: the first one's tables (16 entries of 52
    # bytes, 16 hash slots of 4) make 896, then each name and value is its malloc chunk:
    # "trace" 32 + 48 (28 bytes) and "k" 32 + 48 (40 bytes) make 1056 after the first step; the
    # second step's trace (56 bytes: 64) and k (100 bytes: 112) would make 1136
    runtime = make_rt(variable_bytes=1100)
    steps = var_set("k", "x" * 40, HEALTHY), var_set("k", "y" * 100, HEALTHY)
    req = runtime.new_request(runtime.load(scripted_wasm), arg=script(*steps, HEALTHY))
    seq = req.spawn()
    assert runtime.submit([StepInput(seq, [1], None)]).wait().results[0].status == "ok"
    assert req.vars.held == 1056
    r = runtime.submit([StepInput(seq, [1, 65], 65)]).wait().results[0]
    assert r.status == "error" and "Limits.variable_bytes" in r.error
