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

Last line: one JSON object: legal_killed and healthy_step_ms_p99 (each by level), the p99 ratio
to the 0-looper level, the level wall times, cores and load average. Target: legal_killed 0 at
every level.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from scripted import branch, loop_forever, result, script, spin  # noqa: E402

import aicirt  # noqa: E402
from aicirt import StepInput, toolchain  # noqa: E402

HEALTHY = result(branch(mask=[65]))
FORWARD_S = 0.005


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
            t0 = time.perf_counter()
            h = rt.submit([StepInput(s, [1] * k) for s in healthy])
            o = rt.submit([StepInput(s, [1]) for s in others])
            time.sleep(FORWARD_S)
            out = h.wait(1.0)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="0,4,16", help="looping controllers beside the legal ones, per level")
    ap.add_argument("--legal-ms", default="50,230,900", help="CPU time of the legal controllers' first calls")
    ap.add_argument("--min-steps", type=int, default=500, help="healthy steps at least, per level")
    args = ap.parse_args()
    wasm = toolchain.build_cached(HERE.parent / "tests" / "controllers" / "scripted.c", sdk=False)
    legal_ms = [float(x) for x in args.legal_ms.split(",")]
    levels = [int(x) for x in args.levels.split(",")]
    load0 = os.getloadavg()[0]
    runs = {}
    for n in levels:
        r = runs[n] = run_level(wasm, n, legal_ms, args.min_steps)
        print(f"{n:3d} loopers: legal killed {r['legal_killed']}/{len(legal_ms)} {r['killed_errors']}; healthy step "
              f"p50 {r['healthy_step_ms_p50']:.2f} ms p99 {r['healthy_step_ms_p99']:.2f} ms over {r['steps']} steps; "
              f"{r['healthy_late_steps']} not done in 1 s; legal calls used {r['legal_cpu_ms']} ms of CPU; "
              f"loopers ended {r['loopers_ended']}/{n}; saturated in {r['saturated_steps']} steps; {r['wall_s']:.1f} s",
              flush=True)
    base = runs[levels[0]]["healthy_step_ms_p99"]
    print(json.dumps({
        "legal_killed": {str(n): r["legal_killed"] for n, r in runs.items()},
        "healthy_step_ms_p99": {str(n): round(r["healthy_step_ms_p99"], 3) for n, r in runs.items()},
        "healthy_p99_ratio": {str(n): round(r["healthy_step_ms_p99"] / base, 3) if base else None
                              for n, r in runs.items()},
        "healthy_late_steps": {str(n): r["healthy_late_steps"] for n, r in runs.items()},
        "saturated_steps": {str(n): r["saturated_steps"] for n, r in runs.items()},
        "legal_cpu_ms": {str(n): r["legal_cpu_ms"] for n, r in runs.items()},
        "level_wall_s": {str(n): round(r["wall_s"], 1) for n, r in runs.items()},
        "legal_ms": legal_ms, "cores": os.cpu_count(), "loadavg_start": round(load0, 2),
        "loadavg_end": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
