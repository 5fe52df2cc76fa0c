"""One sequence's submit -> wait latency through the runtime: what the runtime adds to a call.

An engine decoding one sequence (or a server with one controlled request in flight) pays, per
token, the whole `Runtime.submit_rows -> wait` on its own thread. Here that is timed for one
sequence, step after step, with two controllers (bench/controllers/static_mask.c): `cached` (no
work: it hands back a mask it keeps, the runtime copies it) and `busy` (about `--busy-us` µs of
work a call). Per step: the caller's wall time, the caller's CPU time (thread_time), the whole
process's CPU time (workers' spinning included) and the call's own time inside the worker
(`elapsed_us`, the baseline: what a call costs with no runtime around it). `added_us` is wall
minus inside: the runtime's fixed cost per step.

Each configuration is run twice in the same process, alternating: with the caller running a
still-queued call itself at wait() (`Runtime(steal=True)`, opt-in) and with stealing off
(`steal=False`, the default: every call handed to a worker), so the ratios are same-run.
`--forward-us` adds a busy forward pass between submit and wait (the calls then overlap it).

    python bench/step_latency.py [--steps 2000] [--rounds 3] [--vocab 151936] [--busy-us 100]

The last line is one JSON object: `<controller>_<mode>_{wall,added,caller_cpu,process_cpu}_us_p50`
(and wall p99), plus `*_steal_vs_handoff` wall ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import time
from pathlib import Path

import numpy as np

import aicirt
from aicirt.build.toolchain import build_cached

HERE = Path(__file__).resolve().parent


class FakeVocab:
    eos_token_id = 0

    def __init__(self, n: int):
        self.vocab_size = n
        self.token_bytes = [b""] * n

    def encode(self, text):
        return []

    def decode_bytes(self, ids):
        return b""


def pct(xs, q):
    return float(np.percentile(np.asarray(xs), q)) if len(xs) else float("nan")


def busy(us: float) -> None:
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


def run_one(rt, ctrl, arg: bytes, steps: int, forward_us: float) -> dict[str, list[float]]:
    seq = rt.new_request(ctrl, arg=arg).spawn()
    index = np.array([seq.index], np.int64)
    sampled = np.zeros(1, np.int32)
    out = rt.submit_rows(index, np.full(1, -1, np.int32), {0: ([1, 2, 3], 0)}).wait(60.0)   # the first call
    assert out.kind[0] == aicirt.RowKind.MASK, out.results
    rec: dict[str, list[float]] = {"wall": [], "caller_cpu": [], "process_cpu": [], "inside": []}
    for k in range(steps + 20):
        sampled[0] = k % 1000
        t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
        handle = rt.submit_rows(index, sampled)
        if forward_us:
            busy(forward_us)
        out = handle.wait(60.0)
        t1, c1, p1 = time.perf_counter(), time.thread_time(), time.process_time()
        assert out.kind[0] == aicirt.RowKind.MASK, out.results
        if k >= 20:
            rec["wall"].append((t1 - t0) * 1e6)
            rec["caller_cpu"].append((c1 - c0) * 1e6)
            rec["process_cpu"].append((p1 - p0) * 1e6)
            rec["inside"].append(float(out.elapsed_us[0]))
    seq.close()
    return rec


def calibrate(rt, ctrl, target_us: float) -> int:
    """Busy-work rounds for a call of about `target_us` inside the worker."""
    rounds = 20000
    for _ in range(4):
        rec = run_one(rt, ctrl, struct.pack("<I", rounds), 60, 0.0)
        inside = pct(rec["inside"], 50)
        rounds = max(1, int(rounds * target_us / max(inside, 1.0)))
    return rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3, help="alternations of steal / hand-off per configuration")
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--busy-us", type=float, default=100.0)
    ap.add_argument("--forward-us", type=float, default=0.0, help="busy forward pass between submit and wait")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    path = build_cached(HERE / "controllers" / "static_mask.c", sdk=False)
    report: dict[str, object] = {"bench": "step_latency", "vocab": args.vocab, "steps": args.steps,
                                 "workers": args.workers, "forward_us": args.forward_us,
                                 "load": round(os.getloadavg()[0], 1)}
    rts = {mode: aicirt.Runtime(FakeVocab(args.vocab), workers=args.workers, cache_dir=False, steal=(mode == "steal"))
           for mode in ("steal", "handoff")}
    try:
        ctrls = {mode: rt.load(path) for mode, rt in rts.items()}
        work = calibrate(rts["handoff"], ctrls["handoff"], args.busy_us)
        report["busy_rounds"] = work
        configs = {"cached": b"", "busy": struct.pack("<I", work)}
        acc: dict[tuple[str, str], dict[str, list[float]]] = {}
        for _ in range(args.rounds):
            for name, arg in configs.items():
                for mode, rt in rts.items():
                    rec = run_one(rt, ctrls[mode], arg, args.steps, args.forward_us)
                    into = acc.setdefault((name, mode), {k: [] for k in rec})
                    for k, v in rec.items():
                        into[k] += v
        for (name, mode), rec in acc.items():
            added = [w - i for w, i in zip(rec["wall"], rec["inside"])]
            pre = f"{name}_{mode}"
            report[f"{pre}_wall_us_p50"] = pct(rec["wall"], 50)
            report[f"{pre}_wall_us_p99"] = pct(rec["wall"], 99)
            report[f"{pre}_inside_us_p50"] = pct(rec["inside"], 50)
            report[f"{pre}_added_us_p50"] = pct(added, 50)
            report[f"{pre}_caller_cpu_us_p50"] = pct(rec["caller_cpu"], 50)
            report[f"{pre}_process_cpu_us_p50"] = pct(rec["process_cpu"], 50)
            print(f"{name:6s} {mode:7s}: wall p50 {pct(rec['wall'], 50):8.1f} us  p99 {pct(rec['wall'], 99):8.1f}  "
                  f"inside {pct(rec['inside'], 50):7.1f}  added {pct(added, 50):7.1f}  caller CPU "
                  f"{pct(rec['caller_cpu'], 50):7.1f}  process CPU {pct(rec['process_cpu'], 50):7.1f}", flush=True)
        for name in configs:
            report[f"{name}_steal_vs_handoff"] = report[f"{name}_steal_wall_us_p50"] / report[f"{name}_handoff_wall_us_p50"]
    finally:
        for rt in rts.values():
            rt.close()
    report["load_end"] = round(os.getloadavg()[0], 1)
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in report.items()}))


if __name__ == "__main__":
    main()
