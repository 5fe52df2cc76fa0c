"""A stuck or slow controller is charged only for its own running time: it never delays, or
ends, a healthy sequence beside it (issue: hostile neighbours).

Every promise here is checked by the order of events (the healthy sequence got its steps done
while the stuck call was still running) or in CPU time, never against the wall clock, so that the
tests hold on a busy machine (`make test-busy`); how fast a healthy step is beside loopers is a
figure for bench/limits_under_load.py. The stuck calls end at their hard limits (CPU time, docs/protocol.md#limits),
which on a loaded machine may take several times as long in wall-clock time: the loops that wait
for them are bounded by conftest.HANG_GUARD_S only, so that a bug cannot hang the suite.
"""
from __future__ import annotations

import time

import pytest
from conftest import RESULT_WAIT_S, cpu_seconds, guarded_steps
from scripted import branch, loop_forever, result, script

import aicirt
from aicirt import StepInput

pytestmark = pytest.mark.timing

HEALTHY = result(branch(mask=[65]))


@pytest.mark.parametrize("loopers", [2, 3])
def test_loopers_occupying_every_worker_never_end_a_healthy_sequence(make_rt, scripted_wasm, loopers):
    runtime = make_rt(call_timeout_s=1.0, first_call_timeout_s=1.0, soft_deadline_s=0.02)
    ctrl = runtime.load(scripted_wasm)
    bad = [runtime.new_request(ctrl, arg=script(HEALTHY, loop_forever())).spawn() for _ in range(loopers)]
    good = runtime.new_request(ctrl, arg=script(HEALTHY)).spawn()
    runtime.submit([StepInput(s, [1]) for s in (*bad, good)]).wait(RESULT_WAIT_S)   # first calls: all quick
    steps = []   # (the healthy sequence's status, loopers still stuck after the step)
    for k in guarded_steps("the loopers hit their limits"):
        live = [s for s in bad if not s.finished]
        if not live:
            break
        out = runtime.submit([StepInput(good, [1] * (k + 2))] + [StepInput(s, [1, 1]) for s in live]).wait()
        assert out.results[0].status != "error", out.results[0].error
        steps.append((out.results[0].status, sum(not s.finished for s in bad)))
    assert all("late 10 steps" in s.error or "time limit" in s.error for s in bad), [s.error for s in bad]
    # Never queued behind the loopers until they ended: extra workers took the healthy calls, so
    # it got results while every looper was still stuck. (A step of its may be "pending" on a busy
    # machine, its call not given a CPU within 20 ms: lateness, never an error.)
    assert ("ok", loopers) in steps, steps


def test_a_slow_first_call_does_not_hold_up_the_batch(make_rt, scripted_wasm):
    """A first call that runs until its 2 s limit: the healthy sequence beside it gets ten
    steps done while it still runs (each wait ends at the soft deadline), then the slow one fails."""
    runtime = make_rt(soft_deadline_s=0.02, first_call_timeout_s=2.0)
    ctrl = runtime.load(scripted_wasm)
    slow = runtime.new_request(ctrl, arg=script(loop_forever())).spawn()
    good = runtime.new_request(ctrl, arg=script(HEALTHY)).spawn()
    ok = 0
    for k in guarded_steps("ten healthy steps beside the slow first call"):
        if ok == 10:
            break
        out = runtime.submit([StepInput(slow, [1]), StepInput(good, [1] * (k + 1))]).wait()
        # not held up: the slow call is still running all the while; the healthy step is "ok",
        # or on a busy machine at worst "pending" (its call not given a CPU within 20 ms)
        assert out.results[0].status == "pending", out.results[0].error
        assert out.results[1].status in ("ok", "pending"), out.results[1].error
        ok += out.results[1].status == "ok"
    for _ in guarded_steps("the slow first call hits its limit"):
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
        c0 = cpu_seconds(thread=True)
        seq = rt.new_request(ctrl).spawn()
        # run here, the loop would have used 0.3 s of this thread's CPU before its limit stopped it
        assert cpu_seconds(thread=True) - c0 < 0.2
        r = rt.submit([StepInput(seq, [1])]).wait().results[0]
        assert r.status == "pending"    # still looping on a worker (run at spawn, it had ended)
        for _ in guarded_steps("_initialize hits its limit"):
            r = rt.submit([StepInput(seq, [1])]).wait().results[0]
            if r.status != "pending":
                break
        assert r.status == "error" and r.error.startswith("_initialize: trap: interrupted"), r.error


def test_extra_workers_leave_once_the_stall_is_over(make_rt, scripted_wasm):
    runtime = make_rt(call_timeout_s=0.3, soft_deadline_s=0.01)
    ctrl = runtime.load(scripted_wasm)
    bad = [runtime.new_request(ctrl, arg=script(HEALTHY, loop_forever())).spawn() for _ in range(2)]
    good = runtime.new_request(ctrl, arg=script(HEALTHY)).spawn()
    runtime.submit([StepInput(s, [1]) for s in (*bad, good)]).wait(RESULT_WAIT_S)
    for k in guarded_steps("the loopers are given up"):
        live = [s for s in bad if not s.finished]
        if not live:
            break
        runtime.submit([StepInput(good, [1] * (k + 2))] + [StepInput(s, [1, 1]) for s in live]).wait()
    # the loopers' calls end at their 0.3 s limit; then the extra workers leave
    for _ in guarded_steps("the extra workers leave"):
        if runtime.pool.threads == runtime.workers:
            break
        runtime.submit([StepInput(good, [1] * (k + 2))]).wait()
        time.sleep(0.01)
    assert runtime.pool.threads == runtime.workers


def test_a_sequence_given_up_as_late_can_be_closed_while_its_call_runs(make_rt, scripted_wasm):
    """Ended for lateness, its call still on a worker: closing it frees the instance only once
    the call has stopped (at its hard limit), and the runtime goes on serving others."""
    runtime = make_rt(call_timeout_s=1.0, soft_deadline_s=0.01)
    ctrl = runtime.load(scripted_wasm)
    bad = runtime.new_request(ctrl, arg=script(HEALTHY, loop_forever())).spawn()
    good = runtime.new_request(ctrl, arg=script(HEALTHY)).spawn()
    runtime.submit([StepInput(bad, [1]), StepInput(good, [1])]).wait(RESULT_WAIT_S)
    for _ in guarded_steps("the looper is given up as late"):
        r = runtime.submit([StepInput(bad, [1, 1])]).wait().results[0]
        if r.status != "pending":
            break
    assert r.status == "error" and "late 10 steps" in r.error, r.error
    assert bad.call_out                     # given up on, still running
    bad.close()
    assert runtime.live_sequences == 2    # not freed under the running call
    n = 2
    for _ in guarded_steps("the closed looper's call stops and it is freed"):
        if runtime.live_sequences == 1:
            break
        # The healthy call must come: a generous wait returns as soon as it does (the default, the
        # 10 ms soft deadline, may pass on a busy machine before its call gets a CPU).
        out = runtime.submit([StepInput(good, [1] * n)]).wait(RESULT_WAIT_S)
        assert out.results[0].status == "ok", out.results[0].error
        n += 1
        time.sleep(0.02)
    assert runtime.live_sequences == 1
