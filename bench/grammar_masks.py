"""Grammar masks: the `grammar` controller through aicirt.Runtime against llguidance's matcher on
the conformance grammars (tests/grammars/*.lark), same Qwen2 vocabulary, same grammar text
(llguidance with forcing off: tests/grammars/harness.py, LLG_PREAMBLE), engines interleaved
grammar by grammar. Every string (valid and invalid) is fed token by token (llguidance's
canonical tokenization) and at every prefix both masks are taken and compared.

Figures (the last line is one JSON object):
  grammars            grammars both compiled
  masks               masks compared
  agree_pct           masks equal to llguidance's, bit for bit (EOS included; our stop = {EOS})
  mask_us_p50/p99     ours: submit -> wait wall per mask on the caller's thread (object API,
                      one sequence), every prefix after the first
  inside_us_p50/p99   ours: the controller's own time per call (inside the Wasm instance)
  llg_mask_us_p50/p99 llguidance: fill_next_token_bitmask wall per mask, same prefixes
  ratio_p50           mask_us_p50 / llg_mask_us_p50 (target <= 1.5)
  ttfm_ms_p50         ours: new request -> first mask (grammar compile + first mask), wall
  llg_ttfm_ms_p50     llguidance: grammar_from_lark + LLMatcher + first fill, wall

Usage: python bench/grammar_masks.py [--vocab qwen2|bytes] [--grammars a,b]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "grammars"))
sys.path.insert(0, str(ROOT / "tests"))

from harness import Llg, Ours, as_mask, byte_vocab, qwen_vocab  # noqa: E402


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(math.ceil(q / 100 * len(xs))) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", default="qwen2", choices=["qwen2", "bytes"])
    ap.add_argument("--grammars", default="")
    a = ap.parse_args()
    v = qwen_vocab() if a.vocab == "qwen2" else byte_vocab()
    names = sorted(p.stem for p in (ROOT / "tests" / "grammars").glob("*.lark"))
    if a.grammars:
        names = [n for n in names if n in a.grammars.split(",")]
    ours, llg = Ours(v), Llg(v)
    ttfm, llg_ttfm = [], []
    compiled = agree = compared = 0
    try:
        for name in names:
            grammar = (ROOT / "tests" / "grammars" / f"{name}.lark").read_text(encoding="utf-8")
            cases = json.loads((ROOT / "tests" / "grammars" / f"{name}.json").read_text(encoding="utf-8"))
            h, err, first_us = ours.open(grammar)
            lm, lerr, lms = llg.compile(grammar)
            if err or lerr:
                print(f"{name}: not compared (ours: {err}; llguidance: {lerr})", flush=True)
                ours.close_handle(h)
                continue
            compiled += 1
            ttfm.append(first_us / 1e3)
            llg_ttfm.append(lms)
            n0, a0 = compared, agree
            for text in cases["valid"] + cases["invalid"]:
                toks = v.tokenize(text.encode("utf-8"))
                x, y = ours.masks(h, toks), llg.masks(lm, toks)
                for k in range(min(len(x), len(y))):
                    compared += 1
                    agree += bool(np.array_equal(as_mask(x[k], v), as_mask(y[k], v)))
            ours.close_handle(h)
            print(f"{name}: {compared - n0} masks, {agree - a0} equal; first mask {first_us / 1e3:.2f} ms "
                  f"(llguidance {lms:.2f} ms)", flush=True)
    finally:
        ours.close()
    r = {
        "bench": "grammar_masks", "vocab": v.name, "grammars": compiled, "masks": compared,
        "agree_pct": round(100.0 * agree / compared, 3) if compared else float("nan"),
        "mask_us_p50": round(pct(ours.wall_us, 50), 1), "mask_us_p99": round(pct(ours.wall_us, 99), 1),
        "inside_us_p50": round(pct(ours.inside_us, 50), 1), "inside_us_p99": round(pct(ours.inside_us, 99), 1),
        "llg_mask_us_p50": round(pct(llg.fill_us, 50), 1), "llg_mask_us_p99": round(pct(llg.fill_us, 99), 1),
        "ttfm_ms_p50": round(pct(ttfm, 50), 2), "llg_ttfm_ms_p50": round(pct(llg_ttfm, 50), 2),
    }
    r["ratio_p50"] = round(r["mask_us_p50"] / r["llg_mask_us_p50"], 2) if r["llg_mask_us_p50"] else float("nan")
    r["inside_ratio_p50"] = round(r["inside_us_p50"] / r["llg_mask_us_p50"], 2) if r["llg_mask_us_p50"] else float("nan")
    print(json.dumps(r))


if __name__ == "__main__":
    main()
