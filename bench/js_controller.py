"""The js controller (controllers/js) against the C `regex` controller on the same pattern, same run.

The JS side runs controllers/js/examples/regex.js (the C regex controller's behaviour, its masks
from the native aici.Regex); both on Qwen2's tokenizer (151,851 ids), both loaded once with their
per-tokenizer init snapshot (the JS interpreter and its API are made by the init, so a request
starts from an initialized interpreter; its script is evaluated on the request's first call).

  ttfm_ms       new request to first mask: Runtime.new_request + spawn + the first call (the
                prompt; the JS side evaluates its script there) until the mask is in the batch's
                array; wall, and this process's CPU (all threads) as ttfm_cpu_ms.
  step_us_p50   one step inside the controller (StepResult.elapsed_us: the worker's mid-process
                call, the mask lifted into the batch row), the model's text following the pattern
                (`1945` then EOS, repeated over fresh requests); median over steps after the first.
  fork_us       Sequence.fork() of a sequence after its first step (a copy of its whole linear
                memory and globals into a fresh instance), median.
  memory_mib    the instance's linear memory after the first step, MiB (what a fork copies, and
                the resident pages a sequence can touch).

Rounds alternate C and JS. Ratios are JS / C of medians in this run. The last line is one JSON
object: {"ttfm_ms", "step_us_p50", "fork_us", "memory_mib", "c": {...}, "ratio": {...}, ...}.

Usage: python bench/js_controller.py [--rounds N]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

PATTERN = "(19|20)[0-9]{2}"
TEXT = "1945"


def one_request(rt, ctrl, arg: bytes, tok, prompt: list[int]) -> dict:
    from aicirt import StepInput
    c0, t0 = time.process_time(), time.perf_counter()
    req = rt.new_request(ctrl, arg=arg)
    seq = req.spawn()
    out = rt.submit([StepInput(seq, list(prompt), None)]).wait()
    ttfm, ttfm_cpu = (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3
    r = out.results[0]
    if r.status != "ok" or not r.branches or r.branches[0].mask_row is None:
        raise RuntimeError(f"no first mask: {r.status} {r.error} {seq.log[-300:]!r}")
    memory_mib = seq.memory.data_len(seq.store) / (1 << 20)
    t0 = time.perf_counter()
    child = seq.fork()
    fork_us = (time.perf_counter() - t0) * 1e6
    child.close()
    steps = []
    tokens = list(prompt)
    for t in tok.encode(TEXT) + [tok.eos_token_id]:
        if not out.masks[r.branches[0].mask_row][t // 32] >> (t % 32) & 1:
            raise RuntimeError(f"token {t} not allowed")
        tokens.append(t)
        out = rt.submit([StepInput(seq, tokens, t)]).wait()
        r = out.results[0]
        if r.status != "ok":
            raise RuntimeError(f"step failed: {r.error}")
        steps.append(r.elapsed_us)
        if not r.branches:
            break
    seq.close()
    req.close()
    return {"ttfm_ms": ttfm, "ttfm_cpu_ms": ttfm_cpu, "fork_us": fork_us, "memory_mib": memory_mib,
            "steps": steps[:-1]}   # the last call only sees EOS and stops: no mask


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    from mask_speed import QwenTokenizer

    import aicirt
    from aicirt.toolchain import CONTROLLERS_DIR, build_cached

    tok = QwenTokenizer()
    limits = aicirt.Limits(first_call_timeout_s=30.0, call_timeout_s=5.0, soft_deadline_s=5.0)
    rt = aicirt.Runtime(tok, limits=limits, workers=1, cache_dir=False)
    prompt = tok.encode("In which year did World War II end? Answer: ")
    examples = CONTROLLERS_DIR / "js" / "examples"
    js = rt.load(build_cached("js"))
    sides = {"c": (rt.load(build_cached("regex")), PATTERN.encode()),
             "js": (js, (examples / "regex.js").read_bytes() + b"\0" + PATTERN.encode()),
             "js_by_hand": (js, (examples / "regex_by_hand.js").read_bytes() + b"\0" + PATTERN.encode())}
    for name, (ctrl, arg) in sides.items():   # warm-up: code paths, the regex's first masks
        for _ in range(3):
            one_request(rt, ctrl, arg, tok, prompt)
    got: dict[str, list[dict]] = {k: [] for k in sides}
    for i in range(args.rounds):
        for name in (list(sides) if i % 2 == 0 else list(sides)[::-1]):
            ctrl, arg = sides[name]
            got[name].append(one_request(rt, ctrl, arg, tok, prompt))
    rt.close()

    def summary(runs: list[dict]) -> dict:
        return {"ttfm_ms": round(statistics.median(r["ttfm_ms"] for r in runs), 3),
                "ttfm_cpu_ms": round(statistics.median(r["ttfm_cpu_ms"] for r in runs), 3),
                "step_us_p50": round(statistics.median(s for r in runs for s in r["steps"]), 2),
                "fork_us": round(statistics.median(r["fork_us"] for r in runs), 1),
                "memory_mib": round(max(r["memory_mib"] for r in runs), 2)}

    js, c, by_hand = summary(got["js"]), summary(got["c"]), summary(got["js_by_hand"])
    for name, s in (("c regex", c), ("js regex.js", js), ("js by hand", by_hand)):
        print(f"{name:12s} ttfm {s['ttfm_ms']:7.3f} ms ({s['ttfm_cpu_ms']:.3f} ms CPU)  step p50 "
              f"{s['step_us_p50']:7.2f} us  fork {s['fork_us']:8.1f} us  memory {s['memory_mib']:.2f} MiB")
    ratio = {k: round(js[k] / c[k], 2) if c[k] else None for k in c}
    ratio_by_hand = {k: round(by_hand[k] / c[k], 2) if c[k] else None for k in c}
    print(json.dumps({**js, "c": c, "ratio": ratio, "js_by_hand": by_hand, "ratio_by_hand": ratio_by_hand, "pattern": PATTERN, "rounds": args.rounds,
                      "targets": {"ttfm_ms": 2.0, "step_us_p50": 20.0, "fork_us": 500.0}}))


if __name__ == "__main__":
    main()
