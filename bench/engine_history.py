"""Engine step time with and without a long history of finished requests, side by side in one run.

Two engines over the scripted backend (a fake model whose forward costs microseconds, so what is
measured is the engine and the runtime), each with its own Runtime. One first serves `--history`
requests to completion (the shipped `regex` controller forcing two tokens, then stopping; in
chunks of `--chunk` at once); the other serves none. Then both get the same `--live` controlled
requests (`regex` `[a-z]*` over a scripted model that keeps to a-z, so they never finish) and
their step times are measured in alternating blocks (fresh, history, fresh, ...), so drift in
machine speed hits both alike.

    python bench/engine_history.py [--history 20000] [--live 4] [--steps 200] [--rounds 5]

Figures: step_us_* (median and p90 of one `Engine.step()`), history_ratio = median step with
history / median step without (target <= 1.1); engine_us_* and engine_history_ratio: the same
without the fake model's forward (which hashes each sequence's whole token list, so it grows as
the live requests do, alike on both sides); held_requests_* (what each engine's scheduler
still holds: only the live requests), runtime_sequences_* (live controller instances in each
Runtime). The last line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SCRIPT = "abcdefghijklmnopqrstuvwxyz"
PROMPT = "Letters: "


def make_engine(tokenizer, workers: int):
    import aicirt
    from aicirt.engine import Engine
    from aicirt.engine.backends import ScriptedBackend

    rt = aicirt.Runtime(tokenizer, workers=workers, cache_dir=False)
    return Engine(ScriptedBackend(tokenizer, script=SCRIPT), rt), rt


def serve_history(engine, ctrl, n: int, chunk: int) -> float:
    """Run `n` short controlled requests to completion; returns the wall time."""
    from aicirt.engine import SamplingParams

    params = SamplingParams(max_tokens=8)
    t0 = time.perf_counter()
    done = 0
    while done < n:
        reqs = [engine.add_request(PROMPT, ctrl, "ab", params=params, chat=False) for _ in range(min(chunk, n - done))]
        for _ in engine.run():
            pass
        bad = [s.error for r in reqs for s in r.sequences if s.finish_reason != "stop"]
        if bad:
            raise SystemExit(f"a history request did not stop cleanly: {bad[0]}")
        done += len(reqs)
    return time.perf_counter() - t0


def add_live(engine, ctrl, k: int) -> list:
    from aicirt.engine import SamplingParams

    params = SamplingParams(max_tokens=10**9, ignore_eos=True)
    return [engine.add_request(PROMPT, ctrl, "[a-z]*", params=params, chat=False) for _ in range(k)]


def time_steps(engine, steps: int) -> tuple[list[float], list[float]]:
    """Per step: the wall time of `step()`, and that minus the (fake) model's forward."""
    wall, own = [], []
    for _ in range(steps):
        f0 = engine.stats.forward_s
        t0 = time.perf_counter()
        engine.step()
        dt = time.perf_counter() - t0
        wall.append(dt * 1e6)
        own.append((dt - (engine.stats.forward_s - f0)) * 1e6)
    return wall, own


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--history", type=int, default=20_000, help="finished requests behind the second engine")
    ap.add_argument("--chunk", type=int, default=1_000, help="history requests in flight at once")
    ap.add_argument("--live", type=int, default=4, help="live controlled requests in each engine")
    ap.add_argument("--steps", type=int, default=200, help="steps timed per engine per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()

    import aicirt
    from aicirt.build.toolchain import build_cached

    tokenizer = aicirt.ByteTokenizer()
    wasm = build_cached("regex")
    fresh, fresh_rt = make_engine(tokenizer, args.workers)
    aged, aged_rt = make_engine(tokenizer, args.workers)
    try:
        fresh_ctrl, aged_ctrl = fresh_rt.load(wasm), aged_rt.load(wasm)
        history_s = serve_history(aged, aged_ctrl, args.history, args.chunk)
        print(f"history: {args.history} requests served in {history_s:.1f} s", file=sys.stderr)
        live = {"fresh": add_live(fresh, fresh_ctrl, args.live), "history": add_live(aged, aged_ctrl, args.live)}
        engines = {"fresh": fresh, "history": aged}
        for e in engines.values():
            time_steps(e, args.warmup)
        times: dict[str, list[float]] = {"fresh": [], "history": []}
        own: dict[str, list[float]] = {"fresh": [], "history": []}
        for _ in range(args.rounds):
            for name, e in engines.items():
                wall, engine_only = time_steps(e, args.steps)
                times[name] += wall
                own[name] += engine_only
        for name, reqs in live.items():
            ended = [s for r in reqs for s in r.sequences if s.finish_reason is not None]
            if ended:
                raise SystemExit(f"{name}: a live request ended during timing: {ended[0].finish_reason} "
                                 f"{ended[0].error}")
        med = {k: float(np.median(v)) for k, v in times.items()}
        p90 = {k: float(np.percentile(v, 90)) for k, v in times.items()}
        own_med = {k: float(np.median(v)) for k, v in own.items()}
        for k in times:
            print(f"{k:8s} step: median {med[k]:7.1f} us, p90 {p90[k]:7.1f} us, without the forward "
                  f"{own_med[k]:7.1f} us ({len(times[k])} steps, {args.live} live requests)", file=sys.stderr)
        result = {
            "history": args.history, "live": args.live, "steps_timed": len(times["fresh"]),
            "step_us_fresh": med["fresh"], "step_us_history": med["history"],
            "step_us_p90_fresh": p90["fresh"], "step_us_p90_history": p90["history"],
            "history_ratio": med["history"] / med["fresh"],
            "engine_us_fresh": own_med["fresh"], "engine_us_history": own_med["history"],
            "engine_history_ratio": own_med["history"] / own_med["fresh"],
            "held_requests_fresh": len(fresh.scheduler), "held_requests_history": len(aged.scheduler),
            "runtime_sequences_fresh": len(fresh_rt.registry), "runtime_sequences_history": len(aged_rt.registry),
            "history_build_s": history_s, "target_ratio": 1.1,
        }
    finally:
        for e, rt in ((fresh, fresh_rt), (aged, aged_rt)):
            e.close()
            rt.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
