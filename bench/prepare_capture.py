"""What a prepared template costs a new argument's first request (docs/snapshots.md#prepared-templates):
the `json` controller through aicirt.Runtime on MaskBench schemas (tests/data/jsonschema), Qwen2's
vocabulary, one request per schema, each a new key.

For each schema: the first call's copy of its instance into the template after `aicirt_prepare`
(spawn.c's aicirt_capture_run, timed in C on the worker: `aicirt_capture.ns`), the pages it wrote,
and the template instance made beside the request on the spawning thread (Python's clock around
it). Usage: python bench/prepare_capture.py [--per-slice N]. The last line is one JSON object:
schemas, capture_us_p50/p90, pages_p50/p90, template_spawn_us_p50/p90, instance_mib (the median
instance's linear memory), load_avg_start/end.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-slice", type=int, default=40)
    args = ap.parse_args()
    from _json_cases import SLICES, VocabTokenizer, sample
    from json_masks import Ours
    from mask_speed import QwenTokenizer

    import aicirt.core.prepared as prepared
    from aicirt.build.toolchain import build_cached

    load_start = os.getloadavg()[0]
    q = QwenTokenizer()
    ours = Ours(VocabTokenizer(q.token_bytes, q.eos_token_id, encode=None), build_cached("json").read_bytes())
    made: list = []
    spawn_us: list[float] = []
    real_init = prepared._Template.__init__

    def timed_init(self, *a) -> None:   # the template instance made beside a new key's request
        t0 = time.perf_counter()
        real_init(self, *a)
        spawn_us.append((time.perf_counter() - t0) * 1e6)
        made.append(self)

    prepared._Template.__init__ = timed_init   # type: ignore[method-assign]
    sizes = []
    for case in [c for name in SLICES for c in sample(name, args.per_slice, seed=0)]:
        text = json.dumps(case["schema"], ensure_ascii=False).encode("utf-8") + b"\0fast_forward=0"
        try:
            req, seq, *_ = ours._first(text)
        except RuntimeError:
            continue
        sizes.append(ours.rt.native.memory(seq.slot)[1])
        seq.close()
        req.close()
    done = [t for t in made if t.capture.written >= 0]
    cap = [t.capture.ns / 1e3 for t in done]
    pages = [t.capture.written for t in done]
    pct = lambda xs, q: round(float(np.percentile(xs, q)), 1)   # noqa: E731
    out = {"bench": "prepare_capture", "schemas": len(done),
           "capture_us_p50": pct(cap, 50), "capture_us_p90": pct(cap, 90),
           "pages_p50": pct(pages, 50), "pages_p90": pct(pages, 90),
           "template_spawn_us_p50": pct(spawn_us, 50), "template_spawn_us_p90": pct(spawn_us, 90),
           "instance_mib": round(float(np.median(sizes)) / (1 << 20), 1),
           "load_avg_start": round(load_start, 1), "load_avg_end": round(os.getloadavg()[0], 1)}
    ours.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
