"""JSON Schema masks: the `json` controller against llguidance on JSONSchemaBench's MaskBench cases
(../shared/jsonschema), same Qwen2 tokenizer, same token sequences, same machine, one run, one
thread each.

Per slice: schemas compiled (%), valid instances accepted (%), invalid ones rejected (%), compile
time p50/p90, mask time p50/p99. Instances are written as the controller writes them (compact,
UTF-8, keys in schema order) and tokenized once, canonically (llguidance's tokenizer), for both.

  mask_us_*          the controller's own time in `mid-process` (what it computes), per token
  runtime_mask_us_*  the same steps through aicirt.Runtime submit -> wait
  llg_mask_us_*      llguidance's fill_next_token_bitmask for the same prefix
  compile_ms_*       the controller's first call with the option `check` (parse and compile the
                     schema, then stop), less that of the schema `true`, the best of two runs (the
                     machine is shared; a generating first call also fetches the token trie and
                     builds the token tables, ~30 ms once per sequence, whatever the schema);
                     llg_compile_ms_*: LLMatcher construction
Each instance runs on a fresh copy of the compiled state (a fork; a deep copy for llguidance), so
masks are computed cold for every instance in both.

Usage: python bench/json_masks.py [--per-slice N | --full] [--slices a,b]. The last line is one
JSON object.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
warnings.filterwarnings("ignore", category=DeprecationWarning)


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(math.ceil(q / 100 * len(xs))) - 1)]


def share(a, b):
    return round(100.0 * a / b, 2) if b else float("nan")


def llg_case(lltok, case, texts, eos, n_words):
    """(compiled, compile_ms, [(valid, accepted)], mask times µs)."""
    import llguidance
    import llguidance.numpy as lln
    grammar = llguidance.LLMatcher.grammar_from_json_schema(case["schema"], defaults={"whitespace_flexible": False})
    t0 = time.perf_counter()
    base = llguidance.LLMatcher(lltok, grammar)
    compile_ms = (time.perf_counter() - t0) * 1e3
    if base.is_error():
        return False, compile_ms, [], []
    bitmask = lln.allocate_token_bitmask(1, lltok.vocab_size)
    verdicts, times = [], []
    for valid, toks in texts:
        m = base.deep_copy()
        ok = True
        for t in toks:
            t0 = time.perf_counter()
            lln.fill_next_token_bitmask(m, bitmask, 0)
            times.append((time.perf_counter() - t0) * 1e6)
            words = bitmask[0].view(np.uint32)
            if not (int(words[t >> 5]) >> (t & 31)) & 1 or not m.consume_token(t):
                ok = False
                break
        if ok:
            lln.fill_next_token_bitmask(m, bitmask, 0)
            ok = m.is_accepting() or bool((int(bitmask[0].view(np.uint32)[eos >> 5]) >> (eos & 31)) & 1)
        verdicts.append((valid, ok))
    return True, compile_ms, verdicts, times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-slice", type=int, default=60, help="schemas per slice (seeded sample)")
    ap.add_argument("--full", action="store_true", help="every schema of every slice")
    ap.add_argument("--slices", default=None)
    args = ap.parse_args()

    import llguidance
    from _json_cases import SLICES, Checker, VocabTokenizer, instance_text, load_slice, sample
    from mask_speed import QwenTokenizer
    from aicirt.toolchain import build_cached

    q = QwenTokenizer()
    lltok = llguidance.LLTokenizer.from_tiktoken(encoder=q.ranks, special_tokens=q.special, pattern=q.pattern,
                                                 eos_token=q.eos_token_id, n_vocab=q.vocab_size)
    tok = VocabTokenizer(q.token_bytes, q.eos_token_id, encode=lambda s: lltok.tokenize_str(s))
    wasm = build_cached("json").read_bytes()
    checker = Checker(tok, wasm)
    compiler = Checker(tok, wasm, options=b"\0check")
    n_words = (q.vocab_size + 31) // 32

    def check_us(schema):
        best = None
        for _ in range(2):
            h, _, us = compiler.open(schema)
            compiler.close_handle(h)
            best = us if best is None else min(best, us)
        return best

    base_us = statistics.median(check_us(True) for _ in range(5))   # argument reading, a trivial schema

    slices = args.slices.split(",") if args.slices else SLICES
    per_slice, totals = {}, {"n": 0, "ok": 0, "llg_ok": 0, "va": 0, "vn": 0, "ir": 0, "in": 0,
                             "llg_va": 0, "llg_vn": 0, "llg_ir": 0, "llg_in": 0}
    all_inside, all_wall, all_llg, all_compile, all_llg_compile = [], [], [], [], []
    print(f"vocab {q.vocab_size}; Qwen2 tokens; compile base (schema `true`) {base_us:.0f} µs", flush=True)
    t_start = time.perf_counter()
    for name in slices:
        cases = list(load_slice(name)) if args.full else sample(name, args.per_slice, seed=0)
        s = {k: 0 for k in totals}
        inside0, wall0 = len(checker.inside_us), len(checker.wall_us)
        compile_ms, llg_compile, llg_times = [], [], []
        for case in cases:
            s["n"] += 1
            texts = []
            for t in case["tests"]:
                try:
                    texts.append((t["valid"], tok.encode_bytes(instance_text(case["schema"], t["data"]))))
                except (ValueError, RecursionError):
                    pass
            try:
                handle, err, first_us = checker.open(case["schema"])
            except RuntimeError as e:   # a controller failure: counted as not compiled, and shown
                print(f"  {case['id']}: {e}", flush=True)
                s["crashed"] = s.get("crashed", 0) + 1
                handle, err = None, "crashed"
            try:
                if handle is None:
                    pass
                elif err is None:
                    s["ok"] += 1
                    compile_ms.append(max(0.0, check_us(case["schema"]) - base_us) / 1e3)
                    for valid, toks in texts:
                        try:
                            ok, _ = checker.accepts(handle, tok.decode_bytes(toks), tokens=toks)
                            rejected = not ok
                        except RuntimeError as e:   # counts against both rates
                            print(f"  {case['id']}: {e}", flush=True)
                            ok = rejected = False
                        if valid:
                            s["vn"] += 1
                            s["va"] += ok
                        else:
                            s["in"] += 1
                            s["ir"] += rejected
            finally:
                if handle is not None:
                    checker.close_handle(handle)
            lok, lms, verdicts, times = llg_case(lltok, case, texts, q.eos_token_id, n_words)
            llg_compile.append(lms)
            if lok:
                s["llg_ok"] += 1
                llg_times += times
                for valid, ok in verdicts:
                    if valid:
                        s["llg_vn"] += 1
                        s["llg_va"] += ok
                    else:
                        s["llg_in"] += 1
                        s["llg_ir"] += not ok
        inside, wall = checker.inside_us[inside0:], checker.wall_us[wall0:]
        row = {
            "schemas": s["n"], "coverage_pct": share(s["ok"], s["n"]), "llg_coverage_pct": share(s["llg_ok"], s["n"]),
            "valid_accept_pct": share(s["va"], s["vn"]), "invalid_reject_pct": share(s["ir"], s["in"]),
            "llg_valid_accept_pct": share(s["llg_va"], s["llg_vn"]), "llg_invalid_reject_pct": share(s["llg_ir"], s["llg_in"]),
            "compile_ms_p50": round(pct(compile_ms, 50), 3), "compile_ms_p90": round(pct(compile_ms, 90), 3),
            "llg_compile_ms_p50": round(pct(llg_compile, 50), 3), "llg_compile_ms_p90": round(pct(llg_compile, 90), 3),
            "mask_us_p50": round(pct(inside, 50), 1), "mask_us_p99": round(pct(inside, 99), 1),
            "runtime_mask_us_p50": round(pct(wall, 50), 1),
            "llg_mask_us_p50": round(pct(llg_times, 50), 1), "llg_mask_us_p99": round(pct(llg_times, 99), 1),
            "masks": len(inside), "llg_masks": len(llg_times),
        }
        per_slice[name] = row
        for k in totals:
            totals[k] += s[k]
        all_inside += inside
        all_wall += wall
        all_llg += llg_times
        all_compile += compile_ms
        all_llg_compile += llg_compile
        print(f"{name:15s} compiled {row['coverage_pct']:6.2f}% (llg {row['llg_coverage_pct']:6.2f}%)  "
              f"valid ok {row['valid_accept_pct']:6.2f}%  invalid rejected {row['invalid_reject_pct']:6.2f}%  "
              f"compile p50/p90 {row['compile_ms_p50']:.2f}/{row['compile_ms_p90']:.2f} ms (llg "
              f"{row['llg_compile_ms_p50']:.2f}/{row['llg_compile_ms_p90']:.2f})  mask p50/p99 "
              f"{row['mask_us_p50']:.0f}/{row['mask_us_p99']:.0f} µs (llg {row['llg_mask_us_p50']:.0f}/"
              f"{row['llg_mask_us_p99']:.0f}; runtime p50 {row['runtime_mask_us_p50']:.0f})", flush=True)
    checker.close()
    compiler.close()
    result = {
        "bench": "json_masks", "tokenizer": "qwen2", "schemas": totals["n"],
        "coverage_pct": share(totals["ok"], totals["n"]), "llg_coverage_pct": share(totals["llg_ok"], totals["n"]),
        "valid_accept_pct": share(totals["va"], totals["vn"]), "invalid_reject_pct": share(totals["ir"], totals["in"]),
        "llg_valid_accept_pct": share(totals["llg_va"], totals["llg_vn"]),
        "llg_invalid_reject_pct": share(totals["llg_ir"], totals["llg_in"]),
        "mask_us_p50": round(pct(all_inside, 50), 1), "llg_mask_us_p50": round(pct(all_llg, 50), 1),
        "mask_us_p99": round(pct(all_inside, 99), 1), "llg_mask_us_p99": round(pct(all_llg, 99), 1),
        "runtime_mask_us_p50": round(pct(all_wall, 50), 1),
        "compile_ms_p50": round(pct(all_compile, 50), 3), "compile_ms_p90": round(pct(all_compile, 90), 3),
        "llg_compile_ms_p50": round(pct(all_llg_compile, 50), 3),
        "seconds": round(time.perf_counter() - t_start, 1), "per_slice": per_slice,
    }
    print(json.dumps(result).replace("NaN", "null"))


if __name__ == "__main__":
    main()
