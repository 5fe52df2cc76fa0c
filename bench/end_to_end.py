"""End-to-end cost of a controller on the real default model: tokens/s with `regex` vs none.

Same prompt, greedy, same token count (`ignore_eos`, `max_tokens`), in one process, runs
alternated (plain, controlled, plain, ...) after one warm-up of each, so drift in machine speed
hits both sides alike. Also reports how much of the controllers' time the forward pass hid.

    python bench/end_to_end.py [--tokens 48] [--rounds 4] [--pattern REGEX] [--model M]

Figures:
- tokens_per_s_plain / _controlled: generated tokens over generation wall time (all steps,
  including the prompt's forward and, controlled, the controller's first call);
- overhead_pct: how much slower the controlled run is: the median over rounds of the ratio of the
  two runs of that round (adjacent runs see the same machine speed; on a shared 2-core VM the
  forward pass alone drifts by a few per cent between runs, more than the controller costs);
- total_overhead_pct: the same from the summed times of all runs;
- engine_overhead_pct: only what the controller adds on the engine thread (submit + wait + the
  extra mask/apply work) per token, relative to a plain token: the part that does not drift;
- steady_overhead_pct: the same excluding each run's first step (prompt processing, where the
  controller builds its state: that cost is per request, not per token);
- hidden_pct: 100 * (1 - time the engine was blocked on running controllers / time they ran).

The last line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def generate(engine, prompt, ctrl, pattern, tokens):
    from aicirt.engine import SamplingParams

    before = dict(engine.stats.as_dict())
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    t0 = time.perf_counter()
    req = engine.add_request(prompt, ctrl, pattern if ctrl is not None else b"", params=params)
    first_step_s = None
    while not req.finished:
        s0 = time.perf_counter()
        engine.step()
        if first_step_s is None:
            first_step_s = time.perf_counter() - s0
    wall = time.perf_counter() - t0
    after = engine.stats.as_dict()
    (seq,) = req.sequences
    assert seq.finish_reason == "length", (seq.finish_reason, seq.error)
    delta = {k: after[k] - before[k] for k in ("wait_s", "blocked_s", "controller_s", "forward_s", "submit_s", "apply_s")}
    return {"tokens": seq.generated, "wall_s": wall, "first_step_s": first_step_s, "text": seq.text, **delta}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--pattern", default=r"[A-Za-z ,.']{400}")
    ap.add_argument("--prompt", default="Write a long story about a dragon who learns to paint.")
    ap.add_argument("--model", default=None)
    args = ap.parse_args()

    from aicirt.engine.backends import load_backend
    from aicirt.engine import Engine
    from aicirt.runner.run import resolve_controller

    t0 = time.perf_counter()
    backend = load_backend(args.model)
    load_s = time.perf_counter() - t0
    with Engine(backend) as engine:
        ctrl = engine.runtime.load(resolve_controller("regex", progress=False))
        pattern = args.pattern.encode()
        generate(engine, args.prompt, None, pattern, 4)          # warm-up
        generate(engine, args.prompt, ctrl, pattern, 4)
        runs = {"plain": [], "controlled": []}
        for r in range(args.rounds):
            for kind in ("plain", "controlled") if r % 2 == 0 else ("controlled", "plain"):
                res = generate(engine, args.prompt, ctrl if kind == "controlled" else None, pattern, args.tokens)
                runs[kind].append(res)
                print(f"{kind:10s} {res['tokens']} tokens {res['wall_s']:.2f} s "
                      f"({res['tokens'] / res['wall_s']:.1f} tok/s; first step {res['first_step_s'] * 1e3:.0f} ms, "
                      f"waited {res['wait_s'] * 1e3:.1f} ms, controllers {res['controller_s'] * 1e3:.1f} ms)",
                      file=sys.stderr)
        print("controlled text:", repr(runs["controlled"][-1]["text"][:120]), file=sys.stderr)

    def total(kind, key):
        return sum(r[key] for r in runs[kind])

    tps = {k: total(k, "tokens") / total(k, "wall_s") for k in runs}
    ratios = sorted(c["wall_s"] / c["tokens"] / (p["wall_s"] / p["tokens"])
                    for p, c in zip(runs["plain"], runs["controlled"]))
    mid = len(ratios) // 2
    median_ratio = ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
    engine_side = {k: (total(k, "submit_s") + total(k, "wait_s") + total(k, "apply_s")) / total(k, "tokens")
                   for k in runs}
    plain_token_s = total("plain", "wall_s") / total("plain", "tokens")
    steady = {k: (total(k, "tokens") - len(runs[k])) / (total(k, "wall_s") - total(k, "first_step_s")) for k in runs}
    ctrl_s, wait_s = total("controlled", "controller_s"), total("controlled", "wait_s")
    blocked_s = total("controlled", "blocked_s")
    report = {
        "model": args.model or "smollm2", "tokens": args.tokens, "rounds": args.rounds, "pattern": args.pattern,
        "model_load_s": load_s,
        "tokens_per_s_plain": tps["plain"], "tokens_per_s_controlled": tps["controlled"],
        "overhead_pct": (median_ratio - 1) * 100,
        "total_overhead_pct": (tps["plain"] / tps["controlled"] - 1) * 100,
        "engine_overhead_pct": 100 * (engine_side["controlled"] - engine_side["plain"]) / plain_token_s,
        "steady_tokens_per_s_plain": steady["plain"], "steady_tokens_per_s_controlled": steady["controlled"],
        "steady_overhead_pct": (steady["plain"] / steady["controlled"] - 1) * 100,
        "hidden_pct": 100 * max(0.0, 1 - blocked_s / ctrl_s) if ctrl_s > 0 else 100.0,
        "controller_ms_per_run": 1e3 * ctrl_s / len(runs["controlled"]),
        "wait_ms_per_run": 1e3 * wait_s / len(runs["controlled"]),
        "first_step_ms_plain": 1e3 * total("plain", "first_step_s") / len(runs["plain"]),
        "first_step_ms_controlled": 1e3 * total("controlled", "first_step_s") / len(runs["controlled"]),
    }
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in report.items()}))


if __name__ == "__main__":
    main()
