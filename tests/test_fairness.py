"""The scheduler's guarantees under hostile load (docs/embedding.md, "Scheduling guarantees"):

- the engine's thread (the caller) runs no controller's call by default, so no sequence's call
  holds it, however the controller behaves after a cheap start;
- every stuck call gets a worker of its own (up to Limits.max_extra_workers, 512 by default) and
  takes turns with the other stuck calls, least CPU used first: healthy calls and a new request's
  first call never queue behind loopers, however many (more than the 32 extra workers that were
  the default when 40 loopers held up everyone for 40 s);
- the late rule counts CPU time: a legal call late only because the machine is busy is never
  ended by it, a looper still is.

Timing promises are checked as CPU time and as the order of events, never as wall-clock bounds
(they must hold on a 2-core machine at load 8); the figures are in bench/limits_under_load.py.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import RESULT_WAIT_S, cpu_seconds, guarded_steps
from scripted import branch, loop_forever, result, script, spin
from test_cpu_limits import run_until_settled, spin_for_cpu

import aicirt
from aicirt import StepInput

pytestmark = pytest.mark.timing

HEALTHY = result(branch(mask=[65]))


def _burners(per_core: int = 4) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(per_core * (os.cpu_count() or 1))]


def _stop(burners: list[subprocess.Popen]) -> None:
    for b in burners:
        b.kill()
        b.wait()


def test_the_caller_runs_no_call_by_default_so_a_cheap_then_looping_controller_never_holds_it(scripted_wasm):
    """A controller cheap for its first calls, then looping: with the caller-runs rule it held the
    engine's thread for its whole hard limit. By default the caller runs nothing: the engine
    thread's CPU over the looper's whole life stays a small fraction of what the looper used."""
    limits = aicirt.Limits(soft_deadline_s=0.02, call_timeout_s=0.3, max_late_steps=1000)
    with aicirt.Runtime(aicirt.ByteTokenizer(), workers=1, cache_dir=False, limits=limits) as rt:
        ctrl = rt.load(scripted_wasm)
        seq = rt.new_request(ctrl, arg=script(HEALTHY, HEALTHY, HEALTHY, loop_forever())).spawn()
        for k in range(3):
            assert rt.submit([StepInput(seq, [1] * (k + 1))]).wait(RESULT_WAIT_S).results[0].status == "ok"
        c0 = cpu_seconds(thread=True)
        r = None
        for k in guarded_steps("the looper ends by its CPU limit"):
            r = rt.submit([StepInput(seq, [1] * 4)]).wait().results[0]
            if r.status != "pending":
                break
        caller_cpu = cpu_seconds(thread=True) - c0
        assert r.status == "error" and "Limits.call_timeout_s" in r.error, r.error
        assert rt.pool.steals == 0
        looper_cpu = rt.native.call_cpu_us(seq.slot) / 1e6
        if "over its time limit" in r.error:
            assert looper_cpu >= 0.25, looper_cpu
        # the engine's thread only submitted and waited (k steps of a few µs each)
        assert caller_cpu < 0.05 + k * 200e-6, (caller_cpu, k, looper_cpu)


def test_forty_loopers_never_hold_up_a_healthy_sequence_or_a_new_requests_first_call(scripted_wasm):
    """40 looping first calls (more than the 32 extra workers of the old default): each stuck call
    is replaced by a fresh worker, so the healthy sequence's steps and a new request's first call
    all end while the loopers are still running (they end only at their CPU limit, taking turns)."""
    limits = aicirt.Limits(soft_deadline_s=0.02, first_call_timeout_s=0.1, call_timeout_s=0.1)
    with aicirt.Runtime(aicirt.ByteTokenizer(), workers=2, cache_dir=False, limits=limits) as rt:
        ctrl = rt.load(scripted_wasm)
        healthy = rt.new_request(ctrl, arg=script(HEALTHY)).spawn()
        assert rt.submit([StepInput(healthy, [1])]).wait(RESULT_WAIT_S).results[0].status == "ok"
        loopers = [rt.new_request(ctrl, arg=script(loop_forever())).spawn() for _ in range(40)]
        bad = rt.submit([StepInput(s, [1]) for s in loopers])
        bad.wait(0)   # collected below, as each ends
        for k in range(20):   # a healthy engine loop beside them
            r = rt.submit([StepInput(healthy, [1] * (k + 2), 65)]).wait(RESULT_WAIT_S).results[0]
            assert r.status == "ok", r.error
        fresh = rt.new_request(ctrl, arg=script(HEALTHY)).spawn()
        r = rt.submit([StepInput(fresh, [1])]).wait(RESULT_WAIT_S).results[0]
        assert r.status == "ok", r.error
        loopers_done = sum(bool(s.slot.done) for s in loopers)
        stats = rt.pool.stats()
        # the order of events: all of that happened while most loopers were still running
        assert loopers_done < len(loopers) // 2, (loopers_done, stats)
        assert stats.stalled + loopers_done >= 1 and not stats.saturated, stats
        for r in run_until_settled(rt, loopers):
            assert r.status == "error" and "Limits.first_call_timeout_s" in r.error, r.error


def test_a_legal_100ms_call_on_a_busy_machine_is_never_ended_by_the_late_rule(scripted_wasm):
    """Default soft deadline and max_late_steps (25 ms, 10), a call that needs 100 ms of CPU,
    busy processes four a core: it is late for many steps in wall-clock time (it was ended
    "late 10 steps in a row" when the rule counted wall time), but the k-th late step counts only
    once the call has used k soft deadlines of CPU, and 100 ms is four."""
    with aicirt.Runtime(aicirt.ByteTokenizer(), workers=2, cache_dir=False,
                        limits=aicirt.Limits(soft_deadline_s=0.025)) as rt:
        ctrl = rt.load(scripted_wasm)
        n = spin_for_cpu(rt, ctrl, 0.1)
        seq = rt.new_request(ctrl, arg=script(HEALTHY, spin(n, HEALTHY))).spawn()
        assert rt.submit([StepInput(seq, [1])]).wait(RESULT_WAIT_S).results[0].status == "ok"
        burners = _burners()
        try:
            steps = 0
            for steps in guarded_steps("the legal call ends"):
                r = rt.submit([StepInput(seq, [1, 65])]).wait().results[0]
                if r.status != "pending":
                    break
        finally:
            _stop(burners)
        assert r.status == "ok", (r.error, steps)
        assert seq.late_steps == 0


def test_a_looper_is_still_ended_by_the_late_rule_once_it_has_used_its_cpu_allowance(scripted_wasm):
    limits = aicirt.Limits(soft_deadline_s=0.02, max_late_steps=3, call_timeout_s=5.0)
    with aicirt.Runtime(aicirt.ByteTokenizer(), workers=1, cache_dir=False, limits=limits) as rt:
        ctrl = rt.load(scripted_wasm)
        seq = rt.new_request(ctrl, arg=script(HEALTHY, loop_forever())).spawn()
        assert rt.submit([StepInput(seq, [1])]).wait(RESULT_WAIT_S).results[0].status == "ok"
        for _ in guarded_steps("the looper ends by the late rule"):
            r = rt.submit([StepInput(seq, [1, 65])]).wait().results[0]
            if r.status != "pending":
                break
        assert r.status == "error" and "late 3 steps in a row" in r.error, r.error
        # ended only once it had used 3 soft deadlines of CPU (its CPU clock, not the wall clock)
        assert rt.native.call_cpu_us(seq.slot) >= 3 * 0.02 * 1e6
