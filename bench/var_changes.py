"""What variable changes cost the engine's thread: `Engine._retire` (each request's
`take_var_changes`, the VarEvents) per step, for a request that sets a variable of 1 KiB, 64 KiB
or 512 KiB on every call (tests/controllers/scripted.c's var-set) beside a request that sets none,
through `aicirt.engine` on the scripted backend, 40 steps each. Target (issue 27): O(changed
bytes), never seconds. Figures: median and max microseconds a step, wall time on the engine's
thread (a loaded machine stretches them).

    python bench/var_changes.py

Then the neighbour's view (what a caller feels): the engine's step, CPU time of the engine's
thread and wall time, for a healthy request beside a second request that sets 512 KiB every call
and beside the same second request setting nothing (the baseline: one more sequence in the
batch), alternating in the same run (`neighbour`: medians, maxima and the ratios of the medians).

The last line is one JSON object.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import aicirt  # noqa: E402
from aicirt.build import toolchain  # noqa: E402
from aicirt.engine import Engine, SamplingParams  # noqa: E402
from aicirt.engine.backends import ScriptedBackend  # noqa: E402
from scripted import branch, result, script, var_set  # noqa: E402


def neighbour(wasm: Path, size: int, steps: int = 40, rounds: int = 3) -> dict:
    """Median and largest CPU time of the engine's thread (time.thread_time) and wall time a step,
    for a healthy request beside a request that sets `size` bytes every call ("vars") and beside
    the same request setting nothing ("quiet"), alternating `rounds` times (a loaded machine
    shifts both alike)."""
    step = result(branch(mask=[65, 66]))
    times: dict[str, tuple[list[float], list[float]]] = {"quiet": ([], []), "vars": ([], [])}
    for _ in range(rounds):
        for case in ("quiet", "vars"):
            with aicirt.Runtime(aicirt.ByteTokenizer(), limits=aicirt.Limits(soft_deadline_s=5.0),
                                cache_dir=False) as rt:
                engine = Engine(ScriptedBackend(), rt)
                ctrl = rt.load(wasm)
                engine.add_request([1, 2], ctrl, script(step), params=SamplingParams(max_tokens=steps))
                other = script(var_set("v", b"x" * size, step)) if case == "vars" else script(step)
                engine.add_request([1, 2], ctrl, other, params=SamplingParams(max_tokens=steps))
                cpu, wall = times[case]
                while engine.has_unfinished:
                    c0, w0 = time.thread_time(), time.perf_counter()
                    engine.step()
                    cpu.append((time.thread_time() - c0) * 1e6)
                    wall.append((time.perf_counter() - w0) * 1e6)
                engine.close()
    med = {f"{case}_{what}_{stat.__name__}_us": round(stat(series), 1)
           for case, pair in times.items() for what, series in zip(("cpu", "wall"), pair)
           for stat in (statistics.median, max)}
    return {"set_kib": size >> 10, "steps": steps, "rounds": rounds, **med,
            "cpu_ratio": round(med["vars_cpu_median_us"] / med["quiet_cpu_median_us"], 2),
            "wall_ratio": round(med["vars_wall_median_us"] / med["quiet_wall_median_us"], 2)}


def main() -> None:
    wasm = toolchain.build_cached(HERE.parent / "tests" / "controllers" / "scripted.c", sdk=False)
    out: dict = {"bench": "var_changes", "loadavg_before": os.getloadavg()}
    for size in (1 << 10, 64 << 10, 512 << 10):
        with aicirt.Runtime(aicirt.ByteTokenizer(), limits=aicirt.Limits(soft_deadline_s=5.0), cache_dir=False) as rt:
            engine = Engine(ScriptedBackend(), rt)
            ctrl = rt.load(wasm)
            step = result(branch(mask=[65, 66]))
            engine.add_request([1, 2], ctrl, script(var_set("v", b"x" * size, step)), params=SamplingParams(max_tokens=40))
            engine.add_request([1, 2], ctrl, script(step), params=SamplingParams(max_tokens=40))
            retire, times = engine._retire, []

            def timed(events, retire=retire, times=times):
                t0 = time.perf_counter()
                retire(events)
                times.append((time.perf_counter() - t0) * 1e6)
            engine._retire = timed
            while engine.has_unfinished:
                engine.step()
            engine.close()
        key = f"set_{size >> 10}kib"
        out[key] = {"median_us": round(statistics.median(times), 1), "max_us": round(max(times), 1), "steps": len(times)}
        print(f"var-set of {size >> 10} KiB a step: the engine thread's variable handling {out[key]['median_us']} us "
              f"a step (median), {out[key]['max_us']} us at most, {len(times)} steps", file=sys.stderr)
    out["neighbour"] = neighbour(wasm, 512 << 10)
    n = out["neighbour"]
    print(f"the neighbour's engine step beside a request setting 512 KiB a call: {n['vars_cpu_median_us']} us of the "
          f"engine thread's CPU (median; {n['quiet_cpu_median_us']} beside one setting nothing: x{n['cpu_ratio']}; "
          f"max {n['vars_cpu_max_us']} vs {n['quiet_cpu_max_us']}), {n['vars_wall_median_us']} us wall "
          f"({n['quiet_wall_median_us']}: x{n['wall_ratio']}; max {n['vars_wall_max_us']} vs "
          f"{n['quiet_wall_max_us']})", file=sys.stderr)
    out["loadavg_after"] = os.getloadavg()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
