"""JSON Schema masks: the `json` controller against llguidance and xgrammar on JSONSchemaBench's
MaskBench cases (../shared/jsonschema), same Qwen2 tokenizer, same token sequences, same machine,
one run, one thread each.

Per slice: schemas compiled (%), valid instances accepted (%), invalid ones rejected (%), compile
time p50/p90, mask time p50/p99. Instances are written as the controller writes them (compact,
UTF-8, keys in schema order) and tokenized once, canonically (llguidance's tokenizer), for all.

  mask_us_*          the controller's own time in `mid-process` (what it computes), per token
  runtime_mask_us_*  the same steps through aicirt.Runtime submit -> wait
  llg_mask_us_*      llguidance's fill_next_token_bitmask for the same prefix
  xgr_mask_us_*      xgrammar's GrammarMatcher.fill_next_token_bitmask for the same prefix
  compile_ms_*       the controller's first call with the option `check` (parse and compile the
                     schema, then stop), less that of the schema `true`, the best of two runs (the
                     machine is shared; a generating first call also fetches the token trie and
                     builds the token tables, ~30 ms once per sequence, whatever the schema);
                     llg_compile_ms_*: LLMatcher construction; xgr_compile_ms_*:
                     GrammarCompiler.compile_json_schema (one thread, no cache)
Each instance runs on a fresh copy of the compiled state (a fork; a deep copy for llguidance, a
new GrammarMatcher for xgrammar), so masks are computed cold for every instance in all three.

xgrammar is optional (`make setup-bench-json` installs it: --no-deps, with apache-tvm-ffi, torch
and transformers); without it the run says so and its figures are null. Its compile takes about a
second a schema here, so it runs on the first --xgr-per-slice schemas of each slice's sample
(xgr_schemas says how many).

Usage: python bench/json_masks.py [--per-slice N | --full] [--slices a,b] [--no-xgr]
[--xgr-per-slice N]. The last line is one JSON object.
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


class Llg:
    """llguidance: LLMatcher per schema (the compile time), a deep copy per instance."""
    prefix = "llg"

    def __init__(self, q):
        import llguidance
        import llguidance.numpy as lln
        self.llguidance, self.lln = llguidance, lln
        self.tok = llguidance.LLTokenizer.from_tiktoken(encoder=q.ranks, special_tokens=q.special, pattern=q.pattern,
                                                        eos_token=q.eos_token_id, n_vocab=q.vocab_size)
        self.bitmask = lln.allocate_token_bitmask(1, self.tok.vocab_size)

    def compile(self, schema):
        grammar = self.llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
        t0 = time.perf_counter()
        m = self.llguidance.LLMatcher(self.tok, grammar)
        return (None if m.is_error() else m), (time.perf_counter() - t0) * 1e3

    def start(self, compiled):
        return compiled.deep_copy()

    def fill(self, m):
        t0 = time.perf_counter()
        self.lln.fill_next_token_bitmask(m, self.bitmask, 0)
        return (time.perf_counter() - t0) * 1e6, self.bitmask[0].view(np.uint32)

    def consume(self, m, t):
        return m.consume_token(t)

    def can_end(self, m, words, eos):
        return m.is_accepting() or allowed(words, eos)


class Xgr:
    """xgrammar: compile_json_schema per schema (the compile time; compact separators, schema
    keys only where the schema says so: strict_mode off), a fresh GrammarMatcher per instance."""
    prefix = "xgr"

    def __init__(self, q):
        import xgrammar
        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo(q.token_bytes, xgrammar.VocabType.RAW, vocab_size=q.vocab_size,
                                      stop_token_ids=[q.eos_token_id])
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.bitmask = xgrammar.allocate_token_bitmask(1, q.vocab_size)

    def compile(self, schema):
        t0 = time.perf_counter()
        try:
            g = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"),
                                                  strict_mode=False)
        except Exception:   # xgrammar's way of saying unsupported (or a schema it cannot read)
            g = None
        return g, (time.perf_counter() - t0) * 1e3

    def start(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, m):
        t0 = time.perf_counter()
        m.fill_next_token_bitmask(self.bitmask, 0)
        return (time.perf_counter() - t0) * 1e6, self.bitmask[0].numpy().view(np.uint32)

    def consume(self, m, t):
        return m.accept_token(t)

    def can_end(self, m, words, eos):
        return m.is_terminated() or allowed(words, eos)


def allowed(words, t) -> bool:
    return bool((int(words[t >> 5]) >> (t & 31)) & 1)


def engine_case(engine, case, texts, eos):
    """(compiled, compile_ms, [(valid, accepted)], mask times µs) for a baseline engine."""
    compiled, compile_ms = engine.compile(case["schema"])
    if compiled is None:
        return False, compile_ms, [], []
    verdicts, times = [], []
    for valid, toks in texts:
        m = engine.start(compiled)
        ok = True
        for t in toks:
            us, words = engine.fill(m)
            times.append(us)
            if not allowed(words, t) or not engine.consume(m, t):
                ok = False
                break
        if ok:
            _, words = engine.fill(m)
            ok = engine.can_end(m, words, eos)
        verdicts.append((valid, ok))
    return True, compile_ms, verdicts, times


def baselines(q, want_xgr: bool) -> tuple[list, str | None]:
    """llguidance (required), and xgrammar when installed (else the reason it is not measured)."""
    engines = [Llg(q)]
    if not want_xgr:
        return engines, "xgrammar: skipped (--no-xgr)"
    try:
        engines.append(Xgr(q))
    except ImportError as e:
        return engines, (f"xgrammar: not measured ({e}; it installs with pip install --no-deps xgrammar "
                         "apache-tvm-ffi, and needs torch, transformers and pydantic: make setup-bench-json)")
    return engines, None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-slice", type=int, default=60, help="schemas per slice (seeded sample)")
    ap.add_argument("--full", action="store_true", help="every schema of every slice")
    ap.add_argument("--slices", default=None)
    ap.add_argument("--no-xgr", action="store_true", help="leave xgrammar out")
    ap.add_argument("--xgr-per-slice", type=int, default=20,
                    help="xgrammar on the first N schemas of each slice's sample only (its compile takes ~1 s "
                         "a schema single-threaded at this vocabulary); 0: all")
    args = ap.parse_args()

    from _json_cases import SLICES, Checker, VocabTokenizer, instance_text, load_slice, sample
    from mask_speed import QwenTokenizer
    from aicirt.toolchain import build_cached

    q = QwenTokenizer()
    engines, xgr_note = baselines(q, not args.no_xgr)
    lltok = engines[0].tok
    tok = VocabTokenizer(q.token_bytes, q.eos_token_id, encode=lambda s: lltok.tokenize_str(s))
    wasm = build_cached("json").read_bytes()
    checker = Checker(tok, wasm)
    compiler = Checker(tok, wasm, options=b"\0check")

    def check_us(schema):
        best = None
        for _ in range(2):
            h, _, us = compiler.open(schema)
            compiler.close_handle(h)
            best = us if best is None else min(best, us)
        return best

    base_us = statistics.median(check_us(True) for _ in range(5))   # argument reading, a trivial schema

    slices = args.slices.split(",") if args.slices else SLICES
    keys = ["n", "ok", "va", "vn", "ir", "in"]
    eng_keys = [f"{e.prefix}_{k}" for e in engines for k in keys]
    per_slice, totals = {}, {k: 0 for k in keys + eng_keys}
    runs = {k: [] for k in ["inside", "wall", "compile"] + [f"{e.prefix}_{x}" for e in engines for x in ("mask", "compile")]}
    print(f"vocab {q.vocab_size}; Qwen2 tokens; compile base (schema `true`) {base_us:.0f} µs", flush=True)
    if xgr_note:
        print(xgr_note, flush=True)
    t_start = time.perf_counter()
    for name in slices:
        cases = list(load_slice(name)) if args.full else sample(name, args.per_slice, seed=0)
        s = {k: 0 for k in totals}
        inside0, wall0 = len(checker.inside_us), len(checker.wall_us)
        run = {k: [] for k in runs}
        for i_case, case in enumerate(cases):
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
                    run["compile"].append(max(0.0, check_us(case["schema"]) - base_us) / 1e3)
                    for valid, toks in texts:
                        try:
                            ok, _ = checker.accepts(handle, tok.decode_bytes(toks), tokens=toks)
                            rejected = not ok
                        except RuntimeError as e:   # counts against both rates
                            print(f"  {case['id']}: {e}", flush=True)
                            ok = rejected = False
                        count(s, "", valid, ok, rejected)
            finally:
                if handle is not None:
                    checker.close_handle(handle)
            for e in engines:
                if e.prefix == "xgr" and 0 < args.xgr_per_slice <= i_case:
                    continue
                s[f"{e.prefix}_n"] += 1
                eok, ems, verdicts, times = engine_case(e, case, texts, q.eos_token_id)
                run[f"{e.prefix}_compile"].append(ems)
                if eok:
                    s[f"{e.prefix}_ok"] += 1
                    run[f"{e.prefix}_mask"] += times
                    for valid, ok in verdicts:
                        count(s, f"{e.prefix}_", valid, ok, not ok)
        run["inside"], run["wall"] = checker.inside_us[inside0:], checker.wall_us[wall0:]
        for k in totals:
            totals[k] += s[k]
        for k in runs:
            runs[k] += run[k]
        row = figures(s, run, engines)
        per_slice[name] = row
        print(f"{name:15s} " + summary(row, engines), flush=True)
    checker.close()
    compiler.close()
    result = {"bench": "json_masks", "tokenizer": "qwen2", "schemas": totals["n"], **figures(totals, runs, engines),
              "xgr_available": any(e.prefix == "xgr" for e in engines),
              "seconds": round(time.perf_counter() - t_start, 1), "per_slice": per_slice}
    if xgr_note:
        result["xgr_note"] = xgr_note
    if not result["xgr_available"]:
        result.update({f"xgr_{k}": None for k in ("schemas", "coverage_pct", "valid_accept_pct", "invalid_reject_pct",
                                                   "compile_ms_p50", "compile_ms_p90", "mask_us_p50", "mask_us_p99")})
    print(json.dumps(result).replace("NaN", "null"))


def count(s: dict, prefix: str, valid: bool, ok: bool, rejected: bool) -> None:
    if valid:
        s[prefix + "vn"] += 1
        s[prefix + "va"] += ok
    else:
        s[prefix + "in"] += 1
        s[prefix + "ir"] += rejected


def figures(s: dict, run: dict, engines) -> dict:
    """The figures of a slice (or of the whole run): the controller's, then each baseline's under its prefix."""
    row = {"schemas": s["n"]}
    for p in [""] + [e.prefix + "_" for e in engines]:
        if p:
            row[p + "schemas"] = s[p + "n"]
        row[p + "coverage_pct"] = share(s[p + "ok"], s[p + "n"])
        row[p + "valid_accept_pct"] = share(s[p + "va"], s[p + "vn"])
        row[p + "invalid_reject_pct"] = share(s[p + "ir"], s[p + "in"])
        comp, mask = run[p + "compile"], run[p + "mask" if p else "inside"]
        row[p + "compile_ms_p50"], row[p + "compile_ms_p90"] = round(pct(comp, 50), 3), round(pct(comp, 90), 3)
        row[p + "mask_us_p50"], row[p + "mask_us_p99"] = round(pct(mask, 50), 1), round(pct(mask, 99), 1)
        row[p + "masks"] = len(mask)
        if not p:
            row["runtime_mask_us_p50"] = round(pct(run["wall"], 50), 1)
    return row


def summary(row: dict, engines) -> str:
    out = (f"compiled {row['coverage_pct']:6.2f}%  valid ok {row['valid_accept_pct']:6.2f}%  invalid rejected "
           f"{row['invalid_reject_pct']:6.2f}%  compile p50/p90 {row['compile_ms_p50']:.2f}/{row['compile_ms_p90']:.2f} ms"
           f"  mask p50/p99 {row['mask_us_p50']:.0f}/{row['mask_us_p99']:.0f} µs (runtime p50 "
           f"{row['runtime_mask_us_p50']:.0f})")
    for e in engines:
        p = e.prefix + "_"
        out += (f"\n{'':15s} {e.prefix}: compiled {row[p + 'coverage_pct']:6.2f}%  valid ok {row[p + 'valid_accept_pct']:6.2f}%"
                f"  invalid rejected {row[p + 'invalid_reject_pct']:6.2f}%  compile p50/p90 {row[p + 'compile_ms_p50']:.2f}/"
                f"{row[p + 'compile_ms_p90']:.2f} ms  mask p50/p99 {row[p + 'mask_us_p50']:.0f}/{row[p + 'mask_us_p99']:.0f} µs")
    return out


if __name__ == "__main__":
    main()
