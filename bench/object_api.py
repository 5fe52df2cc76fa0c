"""The object API's cost against the rows API's, per sequence-step, in one run.

`Runtime.submit([StepInput(seq, tokens, sampled)]) -> wait()` (the API docs/embedding.md shows
first: full token lists, result objects) against `submit_rows -> wait` (arrays), both driving
the same controller (bench/controllers/static_mask.c: it does almost nothing, and copies a
151,936-token mask) at batch 1, 64 and 256, each row appending its sampled token, with the token
lists `--context` tokens long (the object API gets the whole list every step and no `unchanged`
hint: what a plain caller does). The two APIs alternate step by step in blocks, so that load
drift hits both alike; figures are medians of the whole submit -> wait divided by the rows
(Python included; 2 workers), and the process CPU time likewise. Ratio: object / rows; target
<= 2 at every batch size.

    python bench/object_api.py [--steps 200] [--context 2000]

The last line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import aicirt  # noqa: E402
from aicirt import StepInput  # noqa: E402
from aicirt.build.toolchain import build_cached  # noqa: E402
from step_overhead import FakeVocab  # noqa: E402


def run(rt, ctrl, batch: int, steps: int, context: int) -> dict:
    rows_seqs = [rt.new_request(ctrl).spawn() for _ in range(batch)]
    obj_seqs = [rt.new_request(ctrl).spawn() for _ in range(batch)]
    prompt = [1 + i % 1000 for i in range(context)]
    tokens = [list(prompt) for _ in obj_seqs]
    index = np.array([s.index for s in rows_seqs], dtype=np.int64)
    rt.submit_rows(index, np.full(batch, -1, np.int32), {i: (prompt, 0) for i in range(batch)}).wait(30.0)
    rt.submit([StepInput(s, t) for s, t in zip(obj_seqs, tokens)]).wait(30.0)
    wall: dict[str, list[float]] = {"rows": [], "object": []}
    cpu: dict[str, list[float]] = {"rows": [], "object": []}
    for k in range(steps):
        tok = 1 + k % 1000
        for api in (("rows", "object") if k % 2 == 0 else ("object", "rows")):
            t0, c0 = time.perf_counter(), time.process_time()
            if api == "rows":
                out = rt.submit_rows(index, np.full(batch, tok, np.int32)).wait(30.0)
                ok = bool((out.kind == 0).all())
            else:
                for t in tokens:
                    t.append(tok)
                res = rt.submit([StepInput(s, t, tok) for s, t in zip(obj_seqs, tokens)]).wait(30.0)
                ok = all(r.status == "ok" for r in res.results)
            wall[api].append((time.perf_counter() - t0) * 1e6 / batch)
            cpu[api].append((time.process_time() - c0) * 1e6 / batch)
            if not ok:
                raise RuntimeError(f"{api}: a row did not give its mask")
    for s in rows_seqs + obj_seqs:
        s.close()
    med = {api: statistics.median(v) for api, v in wall.items()}
    cmed = {api: statistics.median(v) for api, v in cpu.items()}
    q = {api: [round(float(np.percentile(v, 25)), 2), round(float(np.percentile(v, 75)), 2)] for api, v in wall.items()}
    return {"rows_us": round(med["rows"], 2), "object_us": round(med["object"], 2),
            "rows_cpu_us": round(cmed["rows"], 2), "object_cpu_us": round(cmed["object"], 2),
            "ratio": round(med["object"] / med["rows"], 2), "cpu_ratio": round(cmed["object"] / cmed["rows"], 2),
            "iqr_us": q}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--context", type=int, default=2000, help="tokens in each sequence's list")
    ap.add_argument("--batches", default="1,64,256")
    args = ap.parse_args()
    load_before = os.getloadavg()
    ctrl_path = build_cached(HERE / "controllers" / "static_mask.c", sdk=False)
    result: dict = {"bench": "object_api", "context": args.context, "steps": args.steps, "loadavg_before": load_before}
    with aicirt.Runtime(FakeVocab(), workers=2, cache_dir=False,
                        limits=aicirt.Limits(soft_deadline_s=5.0, first_call_timeout_s=30.0,
                                            memory_bytes=16 << 20)) as rt:   # 512 sequences within the default budget
        ctrl = rt.load(ctrl_path)
        for b in (int(x) for x in args.batches.split(",")):
            r = run(rt, ctrl, b, args.steps if b < 256 else max(20, args.steps // 4), args.context)
            result[f"b{b}"] = r
            print(f"batch {b:>3}: rows {r['rows_us']:7.2f} us/seq, object {r['object_us']:7.2f} us/seq "
                  f"({r['ratio']}x; CPU {r['rows_cpu_us']:.2f} vs {r['object_cpu_us']:.2f}, {r['cpu_ratio']}x), "
                  f"IQR {r['iqr_us']}", file=sys.stderr)
    result["loadavg_after"] = os.getloadavg()
    result["ratios"] = {k: v["ratio"] for k, v in result.items() if k.startswith("b") and isinstance(v, dict)}
    result["target_met"] = all(v <= 2.0 for v in result["ratios"].values())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
