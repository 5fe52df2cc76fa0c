"""A stuck or slow controller is charged only for its own running time: it never delays, or
ends, a healthy sequence beside it (issue: hostile neighbours)."""
from __future__ import annotations

import time

import pytest
from scripted import branch, loop_forever, result, script

import aicirt
from aicirt import StepInput

HEALTHY = result(branch(mask=[65]))


@pytest.mark.parametrize("loopers", [2, 3])
def test_loopers_occupying_every_worker_never_end_a_healthy_sequence(make_rt, scripted_wasm, loopers):
    runtime = make_rt(call_timeout_s=1.0, first_call_timeout_s=1.0, soft_deadline_s=0.02)
    ctrl = runtime.load(scripted_wasm)
    bad = [runtime.new_request(ctrl, arg=script(HEALTHY, loop_forever())).spawn() for _ in range(loopers)]
    good = runtime.new_request(ctrl, arg=script(HEALTHY)).spawn()
    runtime.submit([StepInput(s, [1]) for s in (*bad, good)]).wait(1.0)   # first calls: all quick
    statuses = []
    t0 = time.perf_counter()
    for k in range(100):   # until the loopers have hit their limits
        live = [s for s in bad if not s.finished]
        out = runtime.submit([StepInput(good, [1] * (k + 2))] + [StepInput(s, [1, 1]) for s in live]).wait()
        statuses.append(out.results[0].status)
        assert out.results[0].status != "error", out.results[0].error
        if not live:
            break
    # at most the step in which the stall is first seen is pending for the healthy sequence
    assert statuses.count("pending") <= 3, statuses
    assert time.perf_counter() - t0 < 3
    assert all(s.finished and ("late 10 steps" in s.error or "time limit" in s.error) for s in bad)


def test_a_slow_first_call_does_not_hold_up_the_batch(make_rt, scripted_wasm):
    """A first call that runs until its 2 s limit: the healthy sequence beside it gets ten
    steps done long before that (each wait ends at the soft deadline), then the slow one fails."""
    runtime = make_rt(soft_deadline_s=0.02, first_call_timeout_s=2.0)
    ctrl = runtime.load(scripted_wasm)
    slow = runtime.new_request(ctrl, arg=script(loop_forever())).spawn()
    good = runtime.new_request(ctrl, arg=script(HEALTHY)).spawn()
    t0 = time.perf_counter()
    for k in range(10):
        out = runtime.submit([StepInput(slow, [1]), StepInput(good, [1] * (k + 1))]).wait()
        assert out.results[0].status == "pending" and out.results[1].status == "ok", out.results[1].error
    assert time.perf_counter() - t0 < 1.5            # not held up by the 2 s call
    for _ in range(400):
        r = runtime.submit([StepInput(slow, [1])]).wait().results[0]
        if r.status != "pending":
            break
    assert r.status == "error" and "time limit" in r.error, r.error


def test_initialize_runs_on_a_worker_not_at_spawn(hot_path):
    from test_controller_loading import MID_PROCESS, OK_EXPORTS, wat
    body = OK_EXPORTS + MID_PROCESS + '(func (export "_initialize") (loop $l (br $l)))'
    with aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False,
                        limits=aicirt.Limits(first_call_timeout_s=0.3, soft_deadline_s=0.02)) as rt:
        ctrl = rt.load(wat(body))       # a first load compiles in a child process: not spawn's time
        t0 = time.perf_counter()
        seq = rt.new_request(ctrl).spawn()
        assert time.perf_counter() - t0 < 0.2
        r = rt.submit([StepInput(seq, [1])]).wait().results[0]
        assert r.status == "pending"
        for _ in range(100):
            r = rt.submit([StepInput(seq, [1])]).wait().results[0]
            if r.status != "pending":
                break
        assert r.status == "error" and r.error.startswith("_initialize: trap: interrupted"), r.error


def test_extra_workers_leave_once_the_stall_is_over(make_rt, scripted_wasm):
    runtime = make_rt(call_timeout_s=0.3, soft_deadline_s=0.01)
    ctrl = runtime.load(scripted_wasm)
    bad = [runtime.new_request(ctrl, arg=script(HEALTHY, loop_forever())).spawn() for _ in range(2)]
    good = runtime.new_request(ctrl, arg=script(HEALTHY)).spawn()
    runtime.submit([StepInput(s, [1]) for s in (*bad, good)]).wait(1.0)
    for k in range(60):
        live = [s for s in bad if not s.finished]
        runtime.submit([StepInput(good, [1] * (k + 2))] + [StepInput(s, [1, 1]) for s in live]).wait()
        if not live:
            break
    t0 = time.perf_counter()   # the loopers' calls end at their 0.3 s limit; then the extra workers leave
    while runtime.pool.threads > runtime.workers and time.perf_counter() - t0 < 3:
        runtime.submit([StepInput(good, [1] * 70)]).wait()
        time.sleep(0.01)
    assert runtime.pool.threads == runtime.workers


def test_a_sequence_given_up_as_late_can_be_closed_while_its_call_runs(make_rt, scripted_wasm):
    """Ended for lateness, its call still on a worker: closing it frees the instance only once
    the call has stopped (at its hard limit), and the runtime goes on serving others."""
    runtime = make_rt(call_timeout_s=1.0, soft_deadline_s=0.01)
    ctrl = runtime.load(scripted_wasm)
    bad = runtime.new_request(ctrl, arg=script(HEALTHY, loop_forever())).spawn()
    good = runtime.new_request(ctrl, arg=script(HEALTHY)).spawn()
    runtime.submit([StepInput(bad, [1]), StepInput(good, [1])]).wait(1.0)
    for k in range(40):
        r = runtime.submit([StepInput(bad, [1, 1])]).wait().results[0]
        if r.status == "error":
            break
    assert r.status == "error" and "late 10 steps" in r.error, r.error
    assert bad.call_out                     # given up on, still running
    bad.close()
    assert runtime.live_sequences == 2    # not freed under the running call
    t0 = time.perf_counter()
    while runtime.live_sequences > 1 and time.perf_counter() - t0 < 5:
        out = runtime.submit([StepInput(good, [1] * (k + 3))]).wait()
        assert out.results[0].status == "ok"
        time.sleep(0.02)
    assert runtime.live_sequences == 1
