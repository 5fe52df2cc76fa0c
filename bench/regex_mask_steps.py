"""Per-step mask times of the `regex` controller (inside the controller, mask cache off, rows API)
for one or more builds, and llguidance's fill per step on the same regexes and texts (Qwen2):
where a request's masks go (whole-trie walks, slice builds, slices) rather than their medians
(bench/mask_speed.py). llguidance's first mask in a lexer state is a whole walk; later masks in
the same lexer state and Earley row clone the last one (its one-entry bias cache).

Usage: python bench/regex_mask_steps.py [--wasm a.wasm,b.wasm] [--regexes identifier,email] [--reps 3]
The last line is one JSON object: per build and regex, the per-step inside times of each rep.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from mask_speed import CASES, QwenTokenizer, run_ours  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wasm", default="", help="comma-separated regex controller builds (default: controllers/regex)")
    ap.add_argument("--regexes", default="identifier,email,quoted")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    import aicirt
    import llguidance
    import llguidance.numpy as lln
    from aicirt.build.toolchain import build_cached
    tok = QwenTokenizer()
    names = a.regexes.split(",")
    wasms = [Path(w) for w in a.wasm.split(",")] if a.wasm else [build_cached("regex")]
    rt = aicirt.Runtime(tok, limits=aicirt.Limits(first_call_timeout_s=30.0, call_timeout_s=5.0, soft_deadline_s=5.0),
                        workers=1)
    ctrls = [rt.load(w) for w in wasms]
    prompt = tok.encode("Answer: ")
    lltok = llguidance.LLTokenizer.from_tiktoken(encoder=tok.ranks, special_tokens=tok.special, pattern=tok.pattern,
                                                 eos_token=tok.eos_token_id, n_vocab=tok.vocab_size)
    out: dict = {"ours": {}, "llguidance": {}}
    try:
        for name, pattern, text in CASES:
            if name not in names:
                continue
            ids = tok.encode(text)
            for rep in range(a.reps):
                for w, c in zip(wasms, ctrls):   # the builds alternate, rep by rep
                    _, inside, masks = run_ours(rt, c, pattern, prompt, ids, cold=True, passes=1, api="rows")
                    allowed = int(np.unpackbits(masks[0].view(np.uint8)).sum()) if masks[0] is not None else 0
                    print(f"{name} {w.name} rep {rep}: median {statistics.median(inside):.1f} us; per step "
                          f"{[round(x) for x in inside]}; {allowed} tokens at step 1", flush=True)
                    out["ours"].setdefault(w.name, {}).setdefault(name, []).append([round(x, 1) for x in inside])
                m = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_regex(pattern))
                bm = lln.allocate_token_bitmask(1, lltok.vocab_size)
                fills = []
                for k in range(1, len(ids)):
                    m.consume_token(ids[k - 1])
                    t0 = time.perf_counter()
                    lln.fill_next_token_bitmask(m, bm, 0)
                    fills.append(round((time.perf_counter() - t0) * 1e6, 1))
                print(f"{name} llguidance rep {rep}: per step {[round(x) for x in fills]}", flush=True)
                out["llguidance"].setdefault(name, []).append(fills)
    finally:
        rt.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
