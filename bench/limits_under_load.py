"""Legal controllers beside looping ones: are the legal ones ever killed, and how slow do healthy
steps get? (issue: limits in CPU time, a pool that does not oversubscribe the cores)

At each level (0, 4 and 16 looping controllers, `--levels`) one Runtime with the default
Limits (first call 1 s of CPU) runs, beside the loopers (their first call loops until its limit
ends it):

* three legal controllers whose first call spins for 50, 230 and 900 ms of CPU (`--legal-ms`;
  iterations calibrated here, alone, by the call's own CPU time), then answers at once;
* two healthy controllers that answer at once, stepped as an engine would: submit, a 5 ms
  "forward pass", wait for their results. `healthy_step_ms` is that step's wall time.

The legal and looping controllers go in a second batch each step, collected without blocking
(their first calls are pending, never charged as late). A level ends when every legal and
looping controller has finished, and after at least `--min-steps` steps. The baseline in the same run is the level with 0 loopers.

    python bench/limits_under_load.py
    python bench/limits_under_load.py --levels 0,16 --legal-ms 230

Then the hostile burst (`--burst`, 40 looping requests; 0 skips it), timed against the same steps
alone in the same run: half the loopers loop from their first call, half answer three calls
cheaply first (the attack on the caller-runs rule); right after their calls are queued, a new
request's first mask is waited for (`first_mask_wait_s`), then a healthy request runs
`--healthy-steps` engine steps (5 ms forward pass each; `healthy_delay_s`: its finish beside the
loopers minus alone). `caller_held_ms_max` is the most CPU time the engine's thread spent in one
submit + wait of the healthy request (its thread CPU clock: time spent running anyone's call on
it counts, time blocked does not), over every step of every level and the burst.
`--burners N` adds N CPU-burning processes for the whole run (to measure at a given load).

Last line: one JSON object: legal_killed and healthy_step_ms_p99 (each by level), the p99 ratio
to the 0-looper level, the level wall times, `healthy_delay_s_40_loopers`,
`first_mask_wait_s_40_loopers`, `caller_held_ms_max`, cores and load average. Targets:
legal_killed 0 at every level (100 ms legal calls included), healthy delay and first-mask wait
<= 1 s beside 40 loopers at load 8, caller_held_ms_max <= 10.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from scripted import branch, loop_forever, result, script, spin  # noqa: E402

import aicirt  # noqa: E402
from aicirt import StepInput  # noqa: E402
from aicirt.build import toolchain

HEALTHY = result(branch(mask=[65]))
FORWARD_S = 0.005


_held_ms: list[float] = []   # engine-thread CPU ms of each healthy submit + wait, every level


def thread_cpu_s() -> float:
    return time.clock_gettime(time.CLOCK_THREAD_CPUTIME_ID)


def p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))] if xs else 0.0


def settle(rt: aicirt.Runtime, seq: aicirt.Sequence) -> aicirt.StepResult:
    for _ in range(100_000):
        r = rt.submit([StepInput(seq, [1])]).wait(1.0).results[0]
        if r.status != "pending":
            return r
    raise RuntimeError("a calibration call never ended")


def calibrate(rt: aicirt.Runtime, ctrl: aicirt.Controller, cpu_ms: float) -> int:
    """Spin iterations whose call takes `cpu_ms` of CPU (the median of three runs alone)."""
    n, per_iter = 20_000_000, []
    for _ in range(3):
        seq = rt.new_request(ctrl, arg=script(spin(n, HEALTHY))).spawn()
        settle(rt, seq)
        per_iter.append(rt.native.call_cpu_us(seq.slot) / 1e3 / n)
        seq.close()
    return int(cpu_ms / sorted(per_iter)[1])


def run_level(wasm: Path, loopers: int, legal_ms: list[float], min_steps: int) -> dict:
    with aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False) as rt:
        ctrl = rt.load(wasm)
        iters = [calibrate(rt, ctrl, ms) for ms in legal_ms]
        healthy = [rt.new_request(ctrl, arg=script(HEALTHY)).spawn() for _ in range(2)]
        legal = [rt.new_request(ctrl, arg=script(spin(n, HEALTHY))).spawn() for n in iters]
        bad = [rt.new_request(ctrl, arg=script(loop_forever())).spawn() for _ in range(loopers)]
        outcome: dict[aicirt.Sequence, aicirt.StepResult] = {}
        steps: list[float] = []
        saturated = healthy_late = 0
        t_start = time.perf_counter()
        k = 0
        while len(outcome) < len(legal) + len(bad) or k < min_steps:
            k += 1
            others = [s for s in legal + bad if s not in outcome]
            t0, c0 = time.perf_counter(), thread_cpu_s()
            h = rt.submit([StepInput(s, [1] * k) for s in healthy])
            c1 = thread_cpu_s()
            o = rt.submit([StepInput(s, [1]) for s in others])
            time.sleep(FORWARD_S)
            c2 = thread_cpu_s()
            out = h.wait(1.0)
            _held_ms.append((c1 - c0 + thread_cpu_s() - c2) * 1e3)
            steps.append((time.perf_counter() - t0) * 1e3)
            healthy_late += any(r.status != "ok" for r in out.results)   # pending: held up a whole second
            for s, r in zip(others, o.wait(0).results):
                if r.status != "pending":
                    outcome[s] = r
            saturated += rt.pool.stats().saturated
        wall_s = time.perf_counter() - t_start
        killed = [outcome[s].error for s in legal if outcome[s].status != "ok"]
        legal_cpu_ms = [round(rt.native.call_cpu_us(s.slot) / 1e3, 1) for s in legal]
        loopers_ended = sum(outcome[s].status == "error" for s in bad)
    return {"loopers": loopers, "legal_killed": len(killed), "killed_errors": killed,
            "healthy_step_ms_p50": sorted(steps)[len(steps) // 2], "healthy_step_ms_p99": p99(steps),
            "steps": len(steps), "healthy_late_steps": healthy_late, "loopers_ended": loopers_ended,
            "saturated_steps": saturated, "legal_cpu_ms": legal_cpu_ms, "wall_s": wall_s}


def healthy_run(rt: aicirt.Runtime, ctrl: aicirt.Controller, steps: int) -> tuple[float, float]:
    """A new request's first mask (seconds until it came), then `steps` engine steps of a healthy
    request, each a 5 ms forward pass then its wait (seconds for all)."""
    t0 = time.perf_counter()
    fresh = rt.new_request(ctrl, arg=script(HEALTHY)).spawn()
    while rt.submit([StepInput(fresh, [1])]).wait(1.0).results[0].status == "pending":
        pass
    first_mask_s = time.perf_counter() - t0
    fresh.close()
    seq = rt.new_request(ctrl, arg=script(HEALTHY)).spawn()
    t0 = time.perf_counter()
    for k in range(steps):
        c0 = thread_cpu_s()
        h = rt.submit([StepInput(seq, [1] * (k + 1), 65 if k else None)])
        c1 = thread_cpu_s()
        time.sleep(FORWARD_S)
        c2 = thread_cpu_s()
        r = h.wait(1.0).results[0]
        _held_ms.append((c1 - c0 + thread_cpu_s() - c2) * 1e3)
        while r.status == "pending":   # held up a whole second: wait on (it counts in the delay)
            r = rt.submit([StepInput(seq, [1] * (k + 1))]).wait(1.0).results[0]
        assert r.status == "ok", r.error
    healthy_s = time.perf_counter() - t0
    seq.close()
    return first_mask_s, healthy_s


def run_burst(wasm: Path, loopers: int, steps: int) -> dict:
    """The hostile burst: alone first, then beside `loopers` looping requests, in one runtime."""
    with aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False) as rt:
        ctrl = rt.load(wasm)
        healthy_run(rt, ctrl, 5)   # warm
        alone = healthy_run(rt, ctrl, steps)
        # half loop from their first call; half are cheap for three calls first, then loop
        cheap_first = [rt.new_request(ctrl, arg=script(HEALTHY, HEALTHY, HEALTHY, loop_forever())).spawn()
                       for _ in range(loopers // 2)]
        for k in range(3):
            for r in rt.submit([StepInput(s, [1] * (k + 1)) for s in cheap_first]).wait(30.0).results:
                assert r.status == "ok", r.error
        bad = cheap_first + [rt.new_request(ctrl, arg=script(loop_forever())).spawn()
                             for _ in range(loopers - len(cheap_first))]
        t0 = time.perf_counter()
        c0 = thread_cpu_s()
        o = rt.submit([StepInput(s, [1] * (4 if s in cheap_first else 1)) for s in bad])
        o.wait(0)   # collected below
        _held_ms.append((thread_cpu_s() - c0) * 1e3)
        beside = healthy_run(rt, ctrl, steps)
        running = sum(not s.slot.done for s in bad)
        stats = rt.pool.stats()
        ended: dict[aicirt.Sequence, aicirt.StepResult] = {}
        while len(ended) < len(bad):   # every looper ends by its CPU limit (they take turns)
            live = [s for s in bad if s not in ended]
            for s, r in zip(live, rt.submit([StepInput(s, [1]) for s in live]).wait(0.5).results):
                if r.status != "pending":
                    ended[s] = r
        loopers_s = time.perf_counter() - t0
        errors = sorted({r.error.split(" over ")[0][:60] for r in ended.values() if r.error})
        return {"loopers": loopers, "first_mask_s_alone": alone[0], "first_mask_s_beside": beside[0],
                "healthy_s_alone": alone[1], "healthy_s_beside": beside[1], "loopers_running_after": running,
                "threads": stats.threads, "stalled": stats.stalled, "saturated": stats.saturated,
                "steals": rt.pool.steals, "loopers_ended_s": loopers_s, "looper_errors": errors,
                "loopers_ok": sum(r.status == "ok" for r in ended.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="0,4,16", help="looping controllers beside the legal ones, per level")
    ap.add_argument("--legal-ms", default="50,100,230,900", help="CPU time of the legal controllers' first calls")
    ap.add_argument("--min-steps", type=int, default=500, help="healthy steps at least, per level")
    ap.add_argument("--burst", type=int, default=40, help="looping requests of the hostile burst (0: skip it)")
    ap.add_argument("--healthy-steps", type=int, default=50, help="engine steps of the healthy request in the burst")
    ap.add_argument("--burners", type=int, default=0, help="CPU-burning processes beside the whole run")
    args = ap.parse_args()
    wasm = toolchain.build_cached(HERE.parent / "tests" / "controllers" / "scripted.c", sdk=False)
    legal_ms = [float(x) for x in args.legal_ms.split(",")]
    levels = [int(x) for x in args.levels.split(",")]
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.burners)]
    try:
        report = measure(args, wasm, legal_ms, levels)
    finally:
        for b in burners:
            b.kill()
            b.wait()
    print(json.dumps(report))


def measure(args: argparse.Namespace, wasm: Path, legal_ms: list[float], levels: list[int]) -> dict:
    if args.burners:
        time.sleep(1.0)   # let them start
    load0 = os.getloadavg()[0]
    burst = None
    if args.burst:
        burst = run_burst(wasm, args.burst, args.healthy_steps)
        print(f"burst of {burst['loopers']} loopers: first mask {burst['first_mask_s_beside']:.3f} s beside, "
              f"{burst['first_mask_s_alone']:.3f} s alone; healthy {args.healthy_steps} steps "
              f"{burst['healthy_s_beside']:.3f} s beside, {burst['healthy_s_alone']:.3f} s alone; "
              f"{burst['loopers_running_after']} loopers still running then; threads {burst['threads']}, "
              f"stalled {burst['stalled']}, saturated {burst['saturated']}, caller-run calls {burst['steals']}; "
              f"loopers all ended after {burst['loopers_ended_s']:.1f} s: {burst['looper_errors']}", flush=True)
    runs = {}
    for n in levels:
        r = runs[n] = run_level(wasm, n, legal_ms, args.min_steps)
        print(f"{n:3d} loopers: legal killed {r['legal_killed']}/{len(legal_ms)} {r['killed_errors']}; healthy step "
              f"p50 {r['healthy_step_ms_p50']:.2f} ms p99 {r['healthy_step_ms_p99']:.2f} ms over {r['steps']} steps; "
              f"{r['healthy_late_steps']} not done in 1 s; legal calls used {r['legal_cpu_ms']} ms of CPU; "
              f"loopers ended {r['loopers_ended']}/{n}; saturated in {r['saturated_steps']} steps; {r['wall_s']:.1f} s",
              flush=True)
    base = runs[levels[0]]["healthy_step_ms_p99"]
    held = sorted(_held_ms)
    print(f"engine thread CPU per healthy submit + wait: p50 {held[len(held) // 2]:.3f} ms, max {held[-1]:.3f} ms "
          f"over {len(held)}", flush=True)
    b = burst or {}
    return {
        "legal_killed": {str(n): r["legal_killed"] for n, r in runs.items()},
        "healthy_step_ms_p99": {str(n): round(r["healthy_step_ms_p99"], 3) for n, r in runs.items()},
        "healthy_p99_ratio": {str(n): round(r["healthy_step_ms_p99"] / base, 3) if base else None
                              for n, r in runs.items()},
        "healthy_late_steps": {str(n): r["healthy_late_steps"] for n, r in runs.items()},
        "saturated_steps": {str(n): r["saturated_steps"] for n, r in runs.items()},
        "legal_cpu_ms": {str(n): r["legal_cpu_ms"] for n, r in runs.items()},
        "level_wall_s": {str(n): round(r["wall_s"], 1) for n, r in runs.items()},
        "healthy_delay_s_40_loopers" if args.burst == 40 else f"healthy_delay_s_{args.burst}_loopers":
            round(b["healthy_s_beside"] - b["healthy_s_alone"], 3) if b else None,
        "first_mask_wait_s_40_loopers" if args.burst == 40 else f"first_mask_wait_s_{args.burst}_loopers":
            round(b["first_mask_s_beside"], 3) if b else None,
        "first_mask_s_alone": round(b["first_mask_s_alone"], 4) if b else None,
        "burst_loopers_running_after": b.get("loopers_running_after"),
        "caller_held_ms_max": round(held[-1], 3), "caller_held_ms_p50": round(held[len(held) // 2], 4),
        "burners": args.burners,
        "legal_ms": legal_ms, "cores": os.cpu_count(), "loadavg_start": round(load0, 2),
        "loadavg_end": round(os.getloadavg()[0], 2)}


if __name__ == "__main__":
    main()
