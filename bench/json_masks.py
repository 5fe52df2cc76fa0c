"""JSON Schema masks: the `json` controller through aicirt.Runtime against llguidance and xgrammar
on JSONSchemaBench's MaskBench cases (tests/data/jsonschema), same Qwen2 tokenizer, same token
sequences, same machine, one run, one thread each.

Every time is wall time on the caller's thread (time.perf_counter, Python included), the same
timer for every engine; ours is also given from inside, labelled `inner`. Instances are written
as the controller writes them (compact, UTF-8, keys in schema order) and tokenized once,
canonically (llguidance's tokenizer), for all. A mask is timed at every prefix after the first
token of an instance (prefixes 1..n: the step after each sampled token, the end included), in
all engines alike; the first mask of an instance (prefix 0) is untimed.

Ours is driven as an engine drives it, with the rows API (docs/embedding.md "The rows API"):
requests per schema with `fast_forward=0` (so that every step is a mask over the same token
sequence as the baselines), a fork per instance, then per token `submit_rows` with the sampled
token and `wait`. The instances fork from the schema's third request (`--fork-from template`,
the default): the second made the prepared template (Limits.prepared_after) and the third
started from it, as every later request with that schema does in a server; `--fork-from first`
forks them from the schema's first request (no template; what this bench measured before
2026-12-06). Either way each instance starts from what that request's `aicirt_prepare` (or first
call) left: the controller's per-instance caches start empty in every instance.

Fields (the last line; the same per slice under `per_slice`, without the ratios):

  schemas                  schemas tried; `{llg,xgr}_schemas`: those each baseline ran on
  common_schemas           schemas every measured engine compiled: every time percentile and
                           ratio below is over these only (coverage and verdicts are over all)
  coverage_pct, valid_accept_pct, invalid_reject_pct
                           schemas compiled, valid instances accepted, invalid ones rejected (%)
                           (`llg_`/`xgr_` the same for the baselines), over every schema tried,
                           on the instances as given
  valid_accept_reordered_pct, invalid_reject_reordered_pct
                           the same on the instances with their keys in schema order (what this
                           bench measured before: llguidance, like ours, writes keys in schema
                           order, so instances given in another order are rejected by both)
  mask_wall_us_p50/p99     HEADLINE: one token through the runtime, `submit_rows` (the sampled
                           token) -> `wait` until the row's mask is in the array, per token
                           (the outcome read after it, as llguidance's bitmask is viewed after
                           its fill: until 2026-12-06 both reads were inside the timed span)
  mask_submit_us_p50/p99   of mask_wall_us, the `submit_rows` call alone (arrays checked, the row
                           prepared and queued in C); the rest is `wait`: the hand-off to the
                           worker thread, the controller's call, the row collected
  mask_inner_us_p50/p99    the controller's own time in `mid-process` for those steps
                           (`RowsOutcome.elapsed_us`)
  llg_mask_us_p50/p99      llguidance's fill_next_token_bitmask for the same prefixes
  llg_step_us_p50/p99      llguidance's consume_token + fill_next_token_bitmask (what our
                           submit -> wait also does: take the token, then mask)
  xgr_mask_us_p50/p99      xgrammar's GrammarMatcher.fill_next_token_bitmask, same prefixes;
  xgr_step_us_p50/p99      its accept_token + fill_next_token_bitmask
  masks, llg_masks, xgr_masks   how many masks each percentile is over
  ttfm_ms_p50/p90          time to first mask: Runtime.new_request + Request.spawn + the first
                           submit_rows (the prompt) -> wait, until its mask is in the array;
                           `llg_ttfm_ms_*`: grammar_from_json_schema + LLMatcher + the first fill;
                           `xgr_ttfm_ms_*`: compile_json_schema + GrammarMatcher + the first fill;
                           all cold: the schema's first request
  ttfm_warm_ms_p50/p90     warm: the same, for the third request of the same schema right after
                           the first two (what each engine keeps between requests: ours makes a
                           prepared template at an argument's second request, Limits.prepared_after,
                           and starts the later ones from it; llguidance and xgrammar as their
                           Python APIs do with caching left as this bench sets it)
  compile_wall_ms_p50/p90  compile alone: new_request + spawn + submit_rows -> wait of a first
                           call with the option `check` (parse and compile the schema, then stop);
                           `llg_compile_wall_ms_*`: grammar_from_json_schema + LLMatcher;
                           `xgr_compile_wall_ms_*`: compile_json_schema (one thread, no cache)
  compile_inner_ms_p50/p90 the controller's own time in that `check` call
  ttfm_inner_ms_p50/p90    the controller's own time in that first call (`elapsed_us`)
  spawn_ms_p50/p90         the part of ttfm_ms in new_request + spawn (a fresh instance from the
                           controller's init snapshot), before the first call is submitted
  *_vs_llg_*, *_vs_xgr_*   ratios of those percentiles (ours / baseline; > 1: ours slower):
                           mask_wall_vs_llg_p50 (and _p99), mask_wall_vs_llg_step_p50,
                           mask_inner_vs_llg_p50, ttfm_vs_llg_p50, compile_wall_vs_llg_p50, and the
                           same with xgr
  load_avg_start/end       the machine's 1-minute load average when the run began and ended
  checked, rows_calls      ours on an engine that bounds-checks memory (--checked: the layout past
                           the address-space budget) or not; the rows API's calls through the C
                           extension or cffi (AICIRT_PYROWS=0; docs/embedding.md)
  seconds, xgr_available, xgr_note, per_slice

`--pair-wasm M` (masks only): this tree's controller and module M in one process, instance by
instance in turn, with llguidance, `--passes` times: per build mask_wall_us_p50/p99,
mask_inner_us_p50/p99, mask_submit_us_p50 and their ratios to llg_mask_us_p50/p99 (M's prefixed
`other_`), and other_vs_ours_* (M / this tree). Separate runs on a VM catch different machine
phases (up to 1.5x apart on the 2-core VM); this compares two builds within one.

Renamed where the meaning changed: `mask_us_*` (the controller's time) is `mask_inner_us_*`;
`runtime_mask_us_p50` (submit -> wait on the object API) is `mask_wall_us_p50` (the rows API);
`compile_ms_*` (inside, less the schema `true`) is `compile_inner_ms_*` (inside, the whole call)
beside `compile_wall_ms_*`; `llg_compile_ms_*` (LLMatcher alone) is `llg_compile_wall_ms_*`
(grammar_from_json_schema + LLMatcher); `xgr_compile_ms_*` is `xgr_compile_wall_ms_*` (the same
call, renamed alike).

Compile and first mask are one shot each per schema in every engine (a shared machine makes any
single figure noisy; the percentiles over many schemas are what to read). Each instance runs on
a fresh copy of the compiled state (a fork for ours, a deep copy for llguidance, a new
GrammarMatcher for xgrammar), so masks are computed cold for every instance in all three (what
each engine builds ahead at compile time is shared: llguidance's lexer as built when copied,
ours the DFA rows its `aicirt_prepare` built, option `warm`).

xgrammar is optional (`make setup-bench-json` installs it: --no-deps, with apache-tvm-ffi, torch
and transformers); without it the run says so and its figures are null. Its compile takes about a
second a schema here, so it runs on the first --xgr-per-slice schemas of each slice's sample
(xgr_schemas says how many); with it, common_schemas counts only schemas it ran on.

Usage: python bench/json_masks.py [--per-slice N | --full] [--slices a,b] [--no-xgr]
[--xgr-per-slice N] [--any-order] [--compile-only] [--compare-wasm PATH] [--same-masks PATH] [--wasm PATH]
[--options a=1,b] [--fork-from template|first]. --slices hard: this project's own hard cases
(tests/_json_cases.py hard_cases: many optional properties, overlapping oneOf, patterns with
length bounds, ...). --compile-only: coverage over every schema of the slices, our refusals
counted by reason. --any-order: ours with the option any_order (keys in any order, each at most
once); `any_order` in the result says which. --options: more of ours' options (`options` in the
result; e.g. warm=0). The last line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import math
import os
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


def allowed(words, t) -> bool:
    return bool((int(words[t >> 5]) >> (t & 31)) & 1)


class Case:
    """One engine's figures for one schema: compiled or not, one-shot compile and first-mask
    wall times, per-mask wall (and inner or step) times, verdicts."""

    def __init__(self):
        self.compiled = False
        self.compile_ms = self.ttfm_ms = self.compile_inner_ms = self.spawn_ms = self.ttfm_inner_ms = float("nan")
        self.ttfm_warm_ms = float("nan")   # the same schema's first mask again, right after
        self.mask_us: list[float] = []
        self.other_us: list[float] = []     # ours: inner µs; baselines: consume + fill µs
        self.submit_us: list[float] = []    # ours: the submit_rows part of mask_us
        self.verdicts: list[tuple[bool, bool, bool]] = []   # (valid, accepted, rejected)
        self.verdicts_reordered: list[tuple[bool, bool, bool]] = []   # keys in schema order


class Ours:
    """The `json` controller through aicirt.Runtime's rows API, one request per schema."""
    prefix = ""

    def __init__(self, tok, wasm: bytes, options: bytes = b"", fork_from: str = "template"):
        import aicirt
        self.fork_from = fork_from             # the request the instances fork from: see --fork-from
        self.aicirt = aicirt
        # RowKind's values as plain ints: numpy compares a uint8 scalar with an IntEnum member in ~4 µs
        # (its slow path for int subclasses), with an int in 0.1 (docs/embedding.md, the rows API)
        self.mask_kind, self.pending_kind = int(aicirt.RowKind.MASK), int(aicirt.RowKind.PENDING)
        self.options = options                 # extra NUL-separated options (b"\0any_order")
        limits = aicirt.Limits(first_call_timeout_s=60.0, call_timeout_s=10.0, soft_deadline_s=10.0)
        self.rt = aicirt.Runtime(tok, limits=limits, workers=1)
        self.ctrl = self.rt.load(wasm)
        self.prompt = tok.encode("Answer: ")
        self.sampled = np.full(1, -1, np.int32)

    def close(self) -> None:
        self.rt.close()

    def _step(self, idx, sampled, edits, timed: "Case | None" = None):
        """(mask or None, StepResult or None, inner µs) of one row; a late row is waited for.
        `timed`: gets the step's wall (submit_rows -> wait, until the mask is in the array: what
        the caller waits for, the reading of the outcome after it left out, as llguidance's fill
        is timed alone) in mask_us, and submit_rows's part of it in submit_us."""
        t0 = time.perf_counter()
        handle = self.rt.submit_rows(idx, sampled, edits)
        t1 = time.perf_counter()
        out = handle.wait()
        if timed is not None:
            t2 = time.perf_counter()
            timed.mask_us.append((t2 - t0) * 1e6)
            timed.submit_us.append((t1 - t0) * 1e6)
        while out.kind[0] == self.pending_kind:    # late (soft deadline): its result comes later
            out = self.rt.submit_rows(idx, np.full(1, -1, np.int32)).wait()
        if out.kind[0] == self.mask_kind:
            return out.masks[0], None, float(out.elapsed_us[0])
        r = out.results[0]
        if r.status != "ok":
            raise RuntimeError(f"controller error: {r.error} {''.join(r.logs)}")
        row = r.branches[0].mask_row if r.branches else None
        return (None if row is None else out.masks[row]), r, float(out.elapsed_us[0])

    def _first(self, arg: bytes):
        """New request -> its first call's result: (request, sequence, mask, result, wall ms,
        inner µs, ms of those in new_request + spawn). Raises RuntimeError (request closed) if
        the call ended in error."""
        t0 = time.perf_counter()
        req = self.rt.new_request(self.ctrl, arg=arg)
        seq = req.spawn()
        t1 = time.perf_counter()
        try:
            mask, r, inner = self._step(np.array([seq.index]), np.full(1, -1, np.int32), {0: (self.prompt, 0)})
        except RuntimeError:
            seq.close()
            req.close()
            raise
        t2 = time.perf_counter()
        return req, seq, mask, r, (t2 - t0) * 1e3, inner, (t1 - t0) * 1e3

    def run(self, schema, texts, eos, reordered=None) -> tuple[Case, str | None]:
        """(figures, the controller's log when it refused the schema); `reordered`: the instances
        with their keys in schema order (None where the same as given), verdicts only."""
        c = Case()
        text = json.dumps(schema, ensure_ascii=False).encode("utf-8")
        req, seq, _, r, c.compile_ms, inner, _ = self._first(text + self.options + b"\0check")
        seq.close()
        req.close()
        log = "".join(r.logs).strip() if r is not None else ""
        c.compile_inner_ms = inner / 1e3
        req, seq, mask, r, c.ttfm_ms, inner, c.spawn_ms = self._first(text + self.options + b"\0fast_forward=0")
        c.ttfm_inner_ms = inner / 1e3
        try:
            if mask is None:
                return c, (log or "stopped without a log line")
            c.compiled = True
            for i in range(2):   # the second request makes the template, the third starts from it
                req2, seq2, _, _, c.ttfm_warm_ms, _, _ = self._first(text + self.options + b"\0fast_forward=0")
                if i == 1 and self.fork_from == "template":   # the instances fork from the third
                    seq.close()
                    req.close()
                    req, seq = req2, seq2
                else:
                    seq2.close()
                    req2.close()
            for (valid, toks), other in zip(texts, reordered or [None] * len(texts)):
                for toks_, verdicts, timed in ((toks, c.verdicts, c), (other, c.verdicts_reordered, Case())):
                    if toks_ is None:          # reordered: the same text as given
                        verdicts.append(c.verdicts[-1])
                        continue
                    try:
                        ok = self._instance(seq, toks_, eos, timed)
                        verdicts.append((valid, ok, not ok))
                    except RuntimeError as e:   # an error mid-instance counts against both rates
                        print(f"  {e}", flush=True)
                        verdicts.append((valid, False, False))
        finally:
            seq.close()
            req.close()
        return c, None

    def _instance(self, seq, toks, eos, c: Case) -> bool:
        child = seq.fork()
        try:
            idx = np.array([child.index])
            mask, _, _ = self._step(idx, np.full(1, -1, np.int32), {0: (self.prompt, 0)})
            for t in toks:
                if mask is None or not allowed(mask, t):
                    return False
                self.sampled[0] = t
                mask, r, inner = self._step(idx, self.sampled, None, c)
                c.other_us.append(inner)
                if mask is None and r is not None and r.branches:
                    raise RuntimeError("a splice with fast_forward=0")
            return mask is None or allowed(mask, eos)    # no mask: the controller stopped (the end)
        finally:
            child.close()


class Llg:
    """llguidance: LLMatcher per schema, a deep copy per instance."""
    prefix = "llg"

    def __init__(self, q):
        import llguidance
        import llguidance.numpy as lln
        self.llguidance, self.lln = llguidance, lln
        self.tok = llguidance.LLTokenizer.from_tiktoken(encoder=q.ranks, special_tokens=q.special, pattern=q.pattern,
                                                        eos_token=q.eos_token_id, n_vocab=q.vocab_size)
        self.bitmask = lln.allocate_token_bitmask(1, self.tok.vocab_size)
        self.words = self.bitmask[0].view(np.uint32)   # the same memory: made once, not timed per fill

    def compile(self, schema):
        grammar = self.llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
        m = self.llguidance.LLMatcher(self.tok, grammar)
        return None if m.is_error() else m

    def start(self, compiled):
        return compiled.deep_copy()

    def fill(self, m):
        self.lln.fill_next_token_bitmask(m, self.bitmask, 0)
        return self.words

    def consume(self, m, t):
        return m.consume_token(t)

    def can_end(self, m, words, eos):
        return m.is_accepting() or allowed(words, eos)


class Xgr:
    """xgrammar: compile_json_schema per schema (compact separators, schema keys only where the
    schema says so: strict_mode off), a fresh GrammarMatcher per instance."""
    prefix = "xgr"

    def __init__(self, q):
        import xgrammar
        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo(q.token_bytes, xgrammar.VocabType.RAW, vocab_size=q.vocab_size,
                                      stop_token_ids=[q.eos_token_id])
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.bitmask = xgrammar.allocate_token_bitmask(1, q.vocab_size)
        self.words = self.bitmask[0].numpy().view(np.uint32)   # shares the tensor's memory

    def compile(self, schema):
        try:
            return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"),
                                                     strict_mode=False)
        except Exception:   # xgrammar's way of saying unsupported (or a schema it cannot read)
            return None

    def start(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, m):
        m.fill_next_token_bitmask(self.bitmask, 0)
        return self.words

    def consume(self, m, t):
        return m.accept_token(t)

    def can_end(self, m, words, eos):
        return m.is_terminated() or allowed(words, eos)


def baseline_case(engine, schema, texts, eos, reordered=None) -> Case:
    """A baseline's figures for one schema, timed as ours is (wall on this thread); `reordered`
    as in Ours.run (verdicts only)."""
    c = Case()
    t0 = time.perf_counter()
    compiled = engine.compile(schema)
    t1 = time.perf_counter()
    c.compile_ms = (t1 - t0) * 1e3
    if compiled is None:
        return c
    engine.fill(engine.start(compiled))
    c.ttfm_ms = (time.perf_counter() - t0) * 1e3
    c.compiled = True
    for _ in range(2):                 # warm: the same schema a third time (whatever the engine caches)
        t0 = time.perf_counter()
        engine.fill(engine.start(engine.compile(schema)))
        c.ttfm_warm_ms = (time.perf_counter() - t0) * 1e3
    for valid, toks in texts:
        c.verdicts.append(baseline_instance(engine, compiled, valid, toks, eos, c))
    for (valid, _), other, given in zip(texts, reordered or [None] * len(texts), list(c.verdicts)):
        c.verdicts_reordered.append(given if other is None else baseline_instance(engine, compiled, valid, other, eos, Case()))
    return c


def baseline_instance(engine, compiled, valid, toks, eos, c: Case) -> tuple[bool, bool, bool]:
    """One instance through a baseline (its times into `c`): (valid, accepted, rejected)."""
    m = engine.start(compiled)
    words = engine.fill(m)
    ok = True
    for t in toks:
        if not allowed(words, t):
            ok = False
            break
        t0 = time.perf_counter()
        took = engine.consume(m, t)
        t1 = time.perf_counter()
        words = engine.fill(m)
        t2 = time.perf_counter()
        c.mask_us.append((t2 - t1) * 1e6)
        c.other_us.append((t2 - t0) * 1e6)
        if not took:
            ok = False
            break
    ok = ok and engine.can_end(m, words, eos)
    return valid, ok, not ok


def baselines(q, want_xgr: bool) -> tuple[list, str | None]:
    """llguidance (required), and xgrammar when installed (else the reason it is not measured)."""
    engines: list = [Llg(q)]
    if not want_xgr:
        return engines, "xgrammar: skipped (--no-xgr)"
    try:
        engines.append(Xgr(q))
    except ImportError as e:
        return engines, (f"xgrammar: not measured ({e}; it installs with pip install --no-deps xgrammar "
                         "apache-tvm-ffi, and needs torch, transformers and pydantic: make setup-bench-json)")
    return engines, None


def figures(cases: list[dict], prefixes: list[str]) -> dict:
    """The figures over `cases` (each {prefix: Case}, missing where that engine did not run):
    coverage and verdicts over every case an engine ran on, times over the common ones."""
    common = [c for c in cases if all(p in c and c[p].compiled for p in prefixes)]
    row: dict = {"schemas": len(cases), "common_schemas": len(common)}
    for p in prefixes:
        k = p + "_" if p else ""
        ran = [c[p] for c in cases if p in c]
        if p:
            row[k + "schemas"] = len(ran)
        row[k + "coverage_pct"] = share(sum(c.compiled for c in ran), len(ran))
        for suffix, attr in (("", "verdicts"), ("_reordered", "verdicts_reordered")):
            verdicts = [v for c in ran for v in getattr(c, attr)]
            valid = [ok for is_valid, ok, _ in verdicts if is_valid]
            invalid = [rejected for is_valid, _, rejected in verdicts if not is_valid]
            row[k + "valid_accept" + suffix + "_pct"] = share(sum(valid), len(valid))
            row[k + "invalid_reject" + suffix + "_pct"] = share(sum(invalid), len(invalid))
        mine = [c[p] for c in common]
        masks = [x for c in mine for x in c.mask_us]
        other = [x for c in mine for x in c.other_us]
        mask_name, other_name = ("mask_wall_us", "mask_inner_us") if not p else (k + "mask_us", k + "step_us")
        row[k + "masks"] = len(masks)
        submit = [x for c in mine for x in c.submit_us]
        for name, xs in ((mask_name, masks), (other_name, other)) + ((("mask_submit_us", submit),) if not p else ()):
            row[name + "_p50"], row[name + "_p99"] = round(pct(xs, 50), 1), round(pct(xs, 99), 1)
        for name, xs in (("ttfm_ms", [c.ttfm_ms for c in mine]), ("ttfm_warm_ms", [c.ttfm_warm_ms for c in mine]),
                         ("compile_wall_ms", [c.compile_ms for c in mine]),
                         ("compile_inner_ms", [c.compile_inner_ms for c in mine]),
                         ("spawn_ms", [c.spawn_ms for c in mine]), ("ttfm_inner_ms", [c.ttfm_inner_ms for c in mine])):
            if p and name in ("compile_inner_ms", "spawn_ms", "ttfm_inner_ms"):
                continue
            row[k + name + "_p50"], row[k + name + "_p90"] = round(pct(xs, 50), 3), round(pct(xs, 90), 3)
    return row


def ratios(row: dict, prefixes: list[str]) -> dict:
    out = {}
    for p in prefixes[1:]:
        def r(a, b):
            return float(f"{row[a] / row[b]:.3g}") if row[b] else float("nan")
        out[f"mask_wall_vs_{p}_p50"] = r("mask_wall_us_p50", f"{p}_mask_us_p50")
        out[f"mask_wall_vs_{p}_p99"] = r("mask_wall_us_p99", f"{p}_mask_us_p99")
        out[f"mask_wall_vs_{p}_step_p50"] = r("mask_wall_us_p50", f"{p}_step_us_p50")
        out[f"mask_inner_vs_{p}_p50"] = r("mask_inner_us_p50", f"{p}_mask_us_p50")
        out[f"ttfm_vs_{p}_p50"] = r("ttfm_ms_p50", f"{p}_ttfm_ms_p50")
        out[f"ttfm_vs_{p}_p90"] = r("ttfm_ms_p90", f"{p}_ttfm_ms_p90")
        out[f"ttfm_warm_vs_{p}_p50"] = r("ttfm_warm_ms_p50", f"{p}_ttfm_warm_ms_p50")
        out[f"ttfm_warm_vs_{p}_p90"] = r("ttfm_warm_ms_p90", f"{p}_ttfm_warm_ms_p90")
        out[f"compile_wall_vs_{p}_p50"] = r("compile_wall_ms_p50", f"{p}_compile_wall_ms_p50")
    return out


def summary(row: dict, prefixes: list[str]) -> str:
    out = (f"compiled {row['coverage_pct']:6.2f}%  valid ok {row['valid_accept_pct']:6.2f}% (reordered "
           f"{row['valid_accept_reordered_pct']:6.2f}%)  invalid rejected "
           f"{row['invalid_reject_pct']:6.2f}% (reordered {row['invalid_reject_reordered_pct']:6.2f}%)  "
           f"[{row['common_schemas']} common]  mask p50/p99 wall "
           f"{row['mask_wall_us_p50']:.0f}/{row['mask_wall_us_p99']:.0f} µs (submit_rows {row['mask_submit_us_p50']:.0f}/{row['mask_submit_us_p99']:.0f}; inner {row['mask_inner_us_p50']:.0f}/"
           f"{row['mask_inner_us_p99']:.0f})  ttfm p50 {row['ttfm_ms_p50']:.2f} ms  compile p50 "
           f"{row['compile_wall_ms_p50']:.2f} ms (inner {row['compile_inner_ms_p50']:.2f}; spawn p50 {row['spawn_ms_p50']:.2f})")
    for p in prefixes[1:]:
        k = p + "_"
        out += (f"\n{'':15s} {p}: compiled {row[k + 'coverage_pct']:6.2f}%  valid ok {row[k + 'valid_accept_pct']:6.2f}%"
                f" (reordered {row[k + 'valid_accept_reordered_pct']:6.2f}%)  invalid rejected "
                f"{row[k + 'invalid_reject_pct']:6.2f}% (reordered {row[k + 'invalid_reject_reordered_pct']:6.2f}%)  mask p50/p99 {row[k + 'mask_us_p50']:.0f}/"
                f"{row[k + 'mask_us_p99']:.0f} µs (step {row[k + 'step_us_p50']:.0f}/{row[k + 'step_us_p99']:.0f})  "
                f"ttfm p50 {row[k + 'ttfm_ms_p50']:.2f} ms  compile p50 {row[k + 'compile_wall_ms_p50']:.2f} ms")
    return out


def paired_masks(ours: Ours, other: Ours, llg: Llg, cases: list, tok, load_start: float, passes: int) -> None:
    """--pair-wasm: masks only, this tree's controller (`ours`) and the given module (`other`) in
    one process, instance by instance in turn (each build first every other pass), llguidance after
    them, `passes` times over every schema's instances: one machine phase for both builds, where
    separate runs on this VM differ by up to 1.5x. Each build's instances fork from its own third
    request of the schema (its template). The last line is one JSON object: per build (`""`,
    `other_`) mask_wall_us_p50/p99, mask_inner_us_p50/p99, mask_submit_us_p50 and their ratios to
    llguidance's fill (`llg_mask_us_p50/p99`), and other_vs_ours_* (other / ours)."""
    from _json_cases import given_text
    t_start = time.perf_counter()
    work = []
    for case in cases:
        text = json.dumps(case["schema"], ensure_ascii=False).encode("utf-8")
        toks = []
        for t in case["tests"]:
            try:
                toks.append((t["valid"], tok.encode_bytes(given_text(t["data"]))))
            except (ValueError, RecursionError):
                continue
        seqs = []
        for o in (ours, other):
            try:
                req, seq, mask, _, _, _, _ = o._first(text + o.options + b"\0fast_forward=0")
                for _ in range(2):   # the third request starts from the template the second made
                    seq.close()
                    req.close()
                    req, seq, mask, _, _, _, _ = o._first(text + o.options + b"\0fast_forward=0")
            except RuntimeError:
                mask = None
            if mask is None:
                break
            seqs.append((req, seq))
        compiled = llg.compile(case["schema"])
        if len(seqs) == 2 and compiled is not None:
            work.append((seqs, toks, compiled))
        else:
            for req, seq in seqs:
                seq.close()
                req.close()
    timed = {"": Case(), "other_": Case(), "llg_": Case()}
    eos = tok.eos_token_id
    for p in range(passes):
        for seqs, toks, compiled in work:
            for valid, ts in toks:
                pair = (("", ours, seqs[0][1]), ("other_", other, seqs[1][1]))
                for name, o, seq in pair if p % 2 == 0 else pair[::-1]:
                    try:
                        o._instance(seq, ts, eos, timed[name])
                    except RuntimeError as e:
                        print(f"  {e}", flush=True)
                baseline_instance(llg, compiled, valid, ts, eos, timed["llg_"])
    for seqs, _, _ in work:
        for req, seq in seqs:
            seq.close()
            req.close()
    out: dict = {"bench": "json_masks_paired", "schemas": len(cases), "common_schemas": len(work), "passes": passes}
    llg_c = timed["llg_"]
    out["llg_masks"] = len(llg_c.mask_us)
    out["llg_mask_us_p50"], out["llg_mask_us_p99"] = round(pct(llg_c.mask_us, 50), 2), round(pct(llg_c.mask_us, 99), 1)
    for k in ("", "other_"):
        c = timed[k]
        out[f"{k}masks"] = len(c.mask_us)
        for label, xs in (("mask_wall_us", c.mask_us), ("mask_inner_us", c.other_us)):
            out[f"{k}{label}_p50"], out[f"{k}{label}_p99"] = round(pct(xs, 50), 2), round(pct(xs, 99), 1)
        out[f"{k}mask_submit_us_p50"] = round(pct(c.submit_us, 50), 2)
        for q in ("p50", "p99"):
            out[f"{k}mask_wall_vs_llg_{q}"] = round(out[f"{k}mask_wall_us_{q}"] / out[f"llg_mask_us_{q}"], 2)
            out[f"{k}mask_inner_vs_llg_{q}"] = round(out[f"{k}mask_inner_us_{q}"] / out[f"llg_mask_us_{q}"], 2)
    for label in ("mask_wall_us_p50", "mask_wall_us_p99", "mask_inner_us_p50", "mask_inner_us_p99"):
        out[f"other_vs_ours_{label}"] = round(out[f"other_{label}"] / out[label], 2)
    out.update(load_avg_start=round(load_start, 1), load_avg_end=round(os.getloadavg()[0], 1),
               seconds=round(time.perf_counter() - t_start, 1))
    print(json.dumps(out))


def first_masks(ours: Ours, other: Ours, llg: Llg, cases: list, load_start: float) -> None:
    """--compare-wasm: time to first mask of each schema, cold (its first request), second and warm
    (its third: a template is made at an argument's second request, Limits.prepared_after), through two builds of the
    controller (`ours`: this tree's; `other`: the given module, e.g. main's) and llguidance,
    interleaved schema by schema (the two builds in turn first); the last line is one JSON object
    with each engine's ttfm_ms_p50/p90 (cold), ttfm_warm_ms_p50/p90 and
    first_call_inner_ms_p50/p90, over the schemas all three compiled, and `prepared` (how many of
    ours' requests prepared a template, and started from one)."""
    t_start = time.perf_counter()
    rows = []
    for k_case, case in enumerate(cases):
        text = json.dumps(case["schema"], ensure_ascii=False).encode("utf-8")
        row: dict = {}
        builds = (("", ours), ("other_", other))
        for name, o in builds if k_case % 2 == 0 else builds[::-1]:   # each build goes first every other schema
            times = []
            for _ in range(3):             # cold (a schema not seen before), second, warm (third)
                try:
                    req, seq, mask, _, wall, inner, _ = o._first(text + o.options + b"\0fast_forward=0")
                except RuntimeError:
                    mask = None
                else:
                    seq.close()
                    req.close()
                if mask is None:
                    break
                times.append((wall, inner / 1e3))
            if len(times) == 3:
                row[name] = times
        t = []
        for _ in range(3):
            t0 = time.perf_counter()
            compiled = llg.compile(case["schema"])
            if compiled is None:
                break
            llg.fill(llg.start(compiled))
            t.append(((time.perf_counter() - t0) * 1e3, float("nan")))
        if len(t) == 3:
            row["llg_"] = t
        if len(row) == 3:
            rows.append(row)
    out: dict = {"bench": "json_masks_first_mask", "schemas": len(cases), "common_schemas": len(rows)}
    for k in ("", "other_", "llg_"):
        for label, i, j in (("ttfm_ms", 0, 0), ("ttfm_second_ms", 1, 0), ("ttfm_warm_ms", 2, 0),
                            ("first_call_inner_ms", 0, 1)):
            if k == "llg_" and label == "first_call_inner_ms":
                continue
            xs = [r[k][i][j] for r in rows]
            out[f"{k}{label}_p50"], out[f"{k}{label}_p90"] = round(pct(xs, 50), 3), round(pct(xs, 90), 3)
    for k in ("", "other_"):
        for q in ("p50", "p90"):
            out[f"{k}ttfm_vs_llg_{q}"] = round(out[f"{k}ttfm_ms_{q}"] / out[f"llg_ttfm_ms_{q}"], 2)
            out[f"{k}ttfm_second_vs_llg_{q}"] = round(out[f"{k}ttfm_second_ms_{q}"] / out[f"llg_ttfm_second_ms_{q}"], 2)
            out[f"{k}ttfm_warm_vs_llg_{q}"] = round(out[f"{k}ttfm_warm_ms_{q}"] / out[f"llg_ttfm_warm_ms_{q}"], 2)
    st = ours.rt.prepared.stats
    out.update(prepared={"prepared": st.prepared, "forked": st.forked, "unsighted": st.unsighted}, load_avg_start=round(load_start, 1),
               load_avg_end=round(os.getloadavg()[0], 1), seconds=round(time.perf_counter() - t_start, 1))
    print(json.dumps(out))


def same_masks(ours: Ours, other: Ours, cases: list, tok, eos: int, load_start: float) -> None:
    """--same-masks: this tree's controller against the given module (e.g. main's build), mask by
    mask: per schema (from the request --fork-from names), the first mask, then every instance's
    tokens (as given, and with the keys in schema order) fed to both, each mask compared word for word until either rejects a token
    (both must reject the same one). The last line is one JSON object: schemas, compiled (by
    both; `compiled_differs`: by one only), masks compared, `differing` (masks not bit-identical,
    rejections at different tokens included) and the first few differences."""
    from _json_cases import given_text, instance_text
    t_start = time.perf_counter()
    n_masks, differing, compiled, compiled_differs, shown = 0, 0, 0, 0, []

    def first(o, text):   # (--fork-from template: the third request, started from the template)
        try:
            for i in range(3 if o.fork_from == "template" else 1):
                if i:
                    seq.close()
                    req.close()
                req, seq, mask, _, _, _, _ = o._first(text + o.options + b"\0fast_forward=0")
        except RuntimeError:
            return None
        if mask is None:
            seq.close()
            req.close()
            return None
        return req, seq, mask

    for case in cases:
        text = json.dumps(case["schema"], ensure_ascii=False).encode("utf-8")
        a, b = first(ours, text), first(other, text)
        if (a is None) != (b is None):
            compiled_differs += 1
        if a is None or b is None:
            for x in (a, b):
                if x is not None:
                    x[1].close(), x[0].close()
            continue
        compiled += 1
        n_masks += 1
        if not np.array_equal(a[2], b[2]):
            differing += 1
            shown.append((case["id"], "first mask"))
        for t in case["tests"]:
            try:
                docs = {given_text(t["data"]), instance_text(case["schema"], t["data"])}
            except (ValueError, RecursionError):
                continue
            for doc in docs:
                toks = tok.encode_bytes(doc)
                kids = [a[1].fork(), b[1].fork()]
                try:
                    idx = [np.array([k.index]) for k in kids]
                    pair = list(zip((ours, other), idx))
                    masks = [o._step(i, np.full(1, -1, np.int32), {0: (o.prompt, 0)})[0] for o, i in pair]
                    for pos, tk in enumerate(toks + [eos]):
                        n_masks += 1
                        a_, b_ = masks
                        same = (a_ is None) == (b_ is None) and (a_ is None or np.array_equal(a_, b_))
                        if not same:
                            differing += 1
                            shown.append((case["id"], pos))
                            break
                        if masks[0] is None or not allowed(masks[0], tk) or tk == eos:
                            break
                        masks = [o._step(i, np.full(1, tk, np.int32), None)[0] for o, i in pair]
                finally:
                    for k in kids:
                        k.close()
        for x in (a, b):
            x[1].close(), x[0].close()
    print(json.dumps({"bench": "json_masks_same", "schemas": len(cases), "compiled": compiled,
                      "compiled_differs": compiled_differs, "masks": n_masks, "differing": differing,
                      "first_differences": shown[:10], "load_avg_start": round(load_start, 1),
                      "load_avg_end": round(os.getloadavg()[0], 1), "seconds": round(time.perf_counter() - t_start, 1)}))


def coverage(ours: Ours, llg: Llg, slices: list[str], load_start: float) -> None:
    """--compile-only: every schema of `slices` compiled by ours (the option `check`) and by
    llguidance; the last line is one JSON object: schemas, coverage_pct, llg_coverage_pct,
    ours_only, llg_only (schemas one compiles and the other refuses), per_slice, and `refusals`
    (our log lines' keyword and reason, counted, most frequent first)."""
    from collections import Counter

    from _json_cases import load_slice
    t_start = time.perf_counter()
    reasons: Counter = Counter()
    per_slice, llg_only, ours_only = {}, [], []
    n = ok_ours = ok_llg = 0
    for name in slices:
        k = o = g = 0
        for case in load_slice(name):
            text = json.dumps(case["schema"], ensure_ascii=False).encode("utf-8")
            try:
                req, seq, _, r, *_ = ours._first(text + ours.options + b"\0check")
                seq.close()
                req.close()
                log = "".join(r.logs) if r is not None else ""
            except RuntimeError as e:
                log = str(e)
            mine = "json: schema ok" in log
            try:
                theirs = llg.compile(case["schema"]) is not None
            except Exception:              # llguidance raising on a schema: not compiled
                theirs = False
            k, o, g = k + 1, o + mine, g + theirs
            if not mine:
                lines = [x for x in log.splitlines() if x.startswith("json: ")] or [log[:100]]
                line = lines[-1]
                reasons[line.split(" at ")[0] + (" (" + line.split(" (", 1)[1] if " (" in line else "")] += 1
                if theirs:
                    llg_only.append(f"{case['id']}: {line}")
            elif not theirs:
                ours_only.append(case["id"])
        per_slice[name] = {"schemas": k, "coverage_pct": share(o, k), "llg_coverage_pct": share(g, k)}
        print(f"{name:15s} {k} schemas: ours {share(o, k):6.2f}%  llg {share(g, k):6.2f}%", flush=True)
        n, ok_ours, ok_llg = n + k, ok_ours + o, ok_llg + g
    for line in llg_only:
        print(f"  llg compiles, ours refuses: {line}", flush=True)
    print(json.dumps({"bench": "json_masks", "mode": "compile_only", "any_order": bool(ours.options), "schemas": n,
                      "coverage_pct": share(ok_ours, n), "llg_coverage_pct": share(ok_llg, n),
                      "ours_only": len(ours_only), "llg_only": len(llg_only), "per_slice": per_slice,
                      "refusals": dict(reasons.most_common()), "load_avg_start": round(load_start, 1),
                      "seconds": round(time.perf_counter() - t_start, 1)}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-slice", type=int, default=60, help="schemas per slice (seeded sample)")
    ap.add_argument("--full", action="store_true", help="every schema of every slice")
    ap.add_argument("--slices", default=None)
    ap.add_argument("--no-xgr", action="store_true", help="leave xgrammar out")
    ap.add_argument("--compile-only", action="store_true",
                    help="coverage only: compile every schema of the slices in ours and llguidance, count the "
                         "refusals by reason (no masks, no instances)")
    ap.add_argument("--any-order", action="store_true",
                    help="ours with the option any_order (keys in any order, each at most once)")
    ap.add_argument("--xgr-per-slice", type=int, default=20,
                    help="xgrammar on the first N schemas of each slice's sample only (its compile takes ~1 s "
                         "a schema single-threaded at this vocabulary); 0: all")
    ap.add_argument("--compare-wasm", default=None,
                    help="time to first mask only (cold and warm), this tree's controller beside the given "
                         "json module (e.g. main's build) and llguidance, interleaved schema by schema")
    ap.add_argument("--same-masks", default=None,
                    help="masks only: this tree's controller beside the given json module (e.g. main's build), "
                         "every mask of every instance compared bit for bit (no timing)")
    ap.add_argument("--pair-wasm", default=None,
                    help="masks only: this tree's controller beside the given json module in one process, instance "
                         "by instance in turn, with llguidance (one machine phase for both: see paired_masks)")
    ap.add_argument("--passes", type=int, default=4, help="--pair-wasm: passes over every schema's instances")
    ap.add_argument("--wasm", default=None,
                    help="run this json module as ours instead of this tree's build (e.g. main's, for a before/after "
                         "pair of runs on the same machine)")
    ap.add_argument("--options", default="",
                    help="extra options for ours, comma-separated (e.g. warm=0: no DFA states built ahead in "
                         "aicirt_prepare); appended to the argument after a NUL each")
    ap.add_argument("--checked", action="store_true",
                    help="ours on an engine whose code checks every memory access (the layout a Runtime gets past "
                         "the process's address-space budget, docs/embedding.md), for a before/after pair of runs")
    ap.add_argument("--fork-from", choices=("template", "first"), default="template",
                    help="the request each schema's instances fork from: `template` (default), the third request, "
                         "started from the prepared template as every later request of a server is; `first`, the "
                         "schema's first request (no template: what this bench measured before)")
    args = ap.parse_args()

    from _json_cases import SLICES, VocabTokenizer, given_text, instance_text, load_slice, sample
    from mask_speed import QwenTokenizer

    from aicirt.build.toolchain import build_cached

    from aicirt.native import pyrows   # the rows API's calls: the C extension, or cffi where AICIRT_PYROWS=0
    if args.checked:
        from aicirt.native import engine_config
        engine_config.UNCHECKED_BUDGET = 0
    load_start = os.getloadavg()[0]
    q = QwenTokenizer()
    engines, xgr_note = baselines(q, not args.no_xgr)
    lltok = engines[0].tok
    tok = VocabTokenizer(q.token_bytes, q.eos_token_id, encode=lambda s: lltok.tokenize_str(s))
    wasm = Path(args.wasm).read_bytes() if args.wasm else build_cached("json").read_bytes()
    extra = b"".join(b"\0" + o.strip().encode() for o in args.options.split(",") if o.strip())
    ours = Ours(tok, wasm, (b"\0any_order" if args.any_order else b"") + extra, args.fork_from)
    prefixes = [""] + [e.prefix for e in engines]
    print(f"{' '.join(sys.argv[1:]) or '(defaults)'}; vocab {q.vocab_size}; Qwen2 tokens; load {load_start:.1f}; "
          f"{os.cpu_count()} cores; wall times on the caller's thread", flush=True)
    if xgr_note:
        print(xgr_note, flush=True)
    slices = args.slices.split(",") if args.slices else SLICES   # "hard": tests/_json_cases.py HARD
    if args.compile_only:
        coverage(ours, engines[0], slices, load_start)
        return
    if args.same_masks:
        other = Ours(tok, Path(args.same_masks).read_bytes(), ours.options, args.fork_from)
        cases = [c for name in slices
                 for c in (list(load_slice(name)) if args.full else sample(name, args.per_slice, seed=0))]
        same_masks(ours, other, cases, tok, q.eos_token_id, load_start)
        other.close()
        ours.close()
        return
    if args.pair_wasm:
        other = Ours(tok, Path(args.pair_wasm).read_bytes(), ours.options, args.fork_from)
        cases = [c for name in slices for c in (list(load_slice(name)) if args.full else sample(name, args.per_slice, seed=0))]
        paired_masks(ours, other, engines[0], cases, tok, load_start, args.passes)
        other.close()
        ours.close()
        return
    if args.compare_wasm:
        other = Ours(tok, Path(args.compare_wasm).read_bytes(), ours.options)
        cases = [c for name in slices for c in (list(load_slice(name)) if args.full else sample(name, args.per_slice, seed=0))]
        first_masks(ours, other, engines[0], cases, load_start)
        other.close()
        ours.close()
        return
    per_slice, everything = {}, []
    t_start = time.perf_counter()
    for name in slices:
        cases = list(load_slice(name)) if args.full else sample(name, args.per_slice, seed=0)
        rows = []
        for i_case, case in enumerate(cases):
            texts, reordered = [], []
            for t in case["tests"]:
                try:
                    given, canon = given_text(t["data"]), instance_text(case["schema"], t["data"])
                except (ValueError, RecursionError):
                    continue
                texts.append((t["valid"], tok.encode_bytes(given)))
                reordered.append(None if canon == given else tok.encode_bytes(canon))
            rec: dict = {}
            try:
                rec[""], _ = ours.run(case["schema"], texts, q.eos_token_id, reordered)
            except RuntimeError as e:   # a controller failure: counted as not compiled, and shown
                print(f"  {case['id']}: {e}", flush=True)
                rec[""] = Case()
            for e in engines:
                if e.prefix == "xgr" and 0 < args.xgr_per_slice <= i_case:
                    continue
                rec[e.prefix] = baseline_case(e, case["schema"], texts, q.eos_token_id, reordered)
            rows.append(rec)
        everything += rows
        per_slice[name] = row = figures(rows, prefixes)
        print(f"{name:15s} " + summary(row, prefixes), flush=True)
    ours.close()
    total = figures(everything, prefixes)
    result = {"bench": "json_masks", "tokenizer": "qwen2", "any_order": args.any_order, "wasm": args.wasm or "this tree",
              "checked": bool(args.checked), "rows_calls": "cffi" if pyrows.load() is None else "c extension",
              "fork_from": args.fork_from, "options": args.options,
              **total, **ratios(total, prefixes),
              "xgr_available": "xgr" in prefixes, "load_avg_start": round(load_start, 1),
              "load_avg_end": round(os.getloadavg()[0], 1), "seconds": round(time.perf_counter() - t_start, 1),
              "per_slice": per_slice}
    if xgr_note:
        result["xgr_note"] = xgr_note
    if not result["xgr_available"]:
        result.update({f"xgr_{k}": None for k in (
            "schemas", "coverage_pct", "valid_accept_pct", "invalid_reject_pct", "valid_accept_reordered_pct",
            "invalid_reject_reordered_pct", "masks", "mask_us_p50", "mask_us_p99",
            "step_us_p50", "step_us_p99", "ttfm_ms_p50", "ttfm_ms_p90", "ttfm_warm_ms_p50", "ttfm_warm_ms_p90", "compile_wall_ms_p50", "compile_wall_ms_p90")})
    print(json.dumps(result).replace("NaN", "null"))


if __name__ == "__main__":
    main()
