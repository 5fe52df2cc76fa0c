"""Load on `aicirt serve`: N concurrent `/v1/run` streams, N in 1, 8, 32, 64, per model.

The server runs as its own process (`aicirt serve --model M` on 127.0.0.1, a fresh store), the
client here on one asyncio thread (httpx), so client and server do not share a GIL. Every
request runs the `regex` controller with a pattern that cannot end before `--max-tokens`
(greedy, distinct prompts), so each request samples the same number of tokens and N requests
do N times the work of one (on the scripted model noise may end a request early; tokens are
counted as sampled). One warm-up request first (compiles and caches the controller).

Figures per N (the baseline is N = 1, in the same run, against the same server; each a median
over `--rounds` passes, every pass measuring each N in turn):
- tokens_per_s: tokens sampled by all N requests over the wall time from the first request sent
  to the last stream ended;
- ttft_p50_ms / ttft_p99_ms: request sent -> first `run` object with text;
- errors: requests that did not end with status 200, `[DONE]` and no fork error;
- speedup: tokens_per_s at N / tokens_per_s at 1 (what batching buys over one at a time);
- batching_efficiency: speedup / N: 1.0 means N streams cost no more per step than one (perfect
  batching), 1/N that they were served serially.
Top level, one number: batching_gain = tokens_per_s at the largest N / tokens_per_s at N = 1,
each round's ratio taken within that round, the median over rounds (the speedup at the largest N).

    python bench/server_load.py [--models scripted,smollm2] [--concurrency 1,8,32,64] [--max-tokens 32] [--rounds 2]
    python bench/server_load.py --engine vllm [--models smollm2] ...

`--engine vllm` serves each model three ways in the same run, `aicirt serve --engine own`,
`--engine vllm` and `--engine vllm --data-parallel-size 2` (`--dp`; docs/vllm.md), all servers up
at once and each round measuring them in turn, and adds `vllm_vs_own` (the vLLM engine's
tokens/s over the own engine's at each N, the median of the per-round ratios; its min-max in
`vllm_vs_own_spread`), `dp2_vs_vllm` and `dp2_vs_own` likewise; `tokens_per_s_min`/`_max` are
each column's spread over rounds.

The last line is one JSON object: the last model's figures at top level (by default the real
model; with --engine vllm its vLLM figures), `batching_gain` among them, each model's under its
name (with --engine vllm as MODEL@own, MODEL@vllm and MODEL@vllm-dp2), and the ratios above.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Patterns that cannot be complete within max_tokens, so no request stops early. On a real model
# "[a-z ]+" then a \x01 byte (a token no model picks): two DFA states, so masks are cached. The
# scripted model samples noise, which does pick \x01, so there a bounded repeat (its 1000 DFA
# states cost nothing over a 257-token vocabulary, but a cold mask each step over 49k tokens).
PATTERNS = {"scripted": "[a-z ]{1000}"}
DEFAULT_PATTERN = "[a-z ]+\x01"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, store: str, max_batch: int, engine: str = "own",
                 dp: int = 1) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, str(ROOT / "cli.py"), "serve", "--model", model, "--port", str(port), "--store", store,
           "--max-batch", str(max_batch), "--engine", engine]
    if dp > 1:
        cmd += ["--data-parallel-size", str(dp)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"aicirt serve exited: {proc.stderr.read()}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise TimeoutError("aicirt serve did not start within 900 s")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def one_run(client, url: str, k: int, max_tokens: int, pattern: str) -> dict:
    body = {"controller": "regex", "controller_arg": pattern, "prompt": f"Write a line about topic {k}: ",
            "max_tokens": max_tokens, "temperature": 0}
    t0 = time.perf_counter()
    ttft, sampled, ok, done = None, 0, True, False
    try:
        async with client.stream("POST", url + "/v1/run", json=body) as r:
            if r.status_code != 200:
                await r.aread()
                return {"ok": False, "ttft_s": None, "sampled": 0, "status": r.status_code}
            async for line in r.aiter_lines():
                if not line:
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                d = json.loads(line[6:])
                if d.get("object") != "run":
                    continue
                sampled = d["usage"]["sampled_tokens"]
                for f in d["forks"]:
                    if f["error"]:
                        ok = False
                    if f["text"] and ttft is None:
                        ttft = time.perf_counter() - t0
    except Exception as e:  # counted as an error, reported once below
        return {"ok": False, "ttft_s": None, "sampled": 0, "status": repr(e)}
    return {"ok": ok and done, "ttft_s": ttft, "sampled": sampled, "status": 200}


async def load(url: str, n: int, max_tokens: int, offset: int, pattern: str) -> dict:
    import httpx

    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600), limits=limits) as client:
        t0 = time.perf_counter()
        runs = await asyncio.gather(*[one_run(client, url, offset + k, max_tokens, pattern) for k in range(n)])
        wall = time.perf_counter() - t0
    ttfts = sorted(r["ttft_s"] for r in runs if r["ttft_s"] is not None)
    errors = [r["status"] for r in runs if not r["ok"]]
    return {"concurrency": n, "wall_s": wall, "tokens": sum(r["sampled"] for r in runs),
            "tokens_per_s": sum(r["sampled"] for r in runs) / wall,
            "ttft_p50_ms": 1e3 * percentile(ttfts, 50), "ttft_p99_ms": 1e3 * percentile(ttfts, 99),
            "errors": len(errors), "error_samples": errors[:3]}


def percentile(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def bench_model(model: str, levels: list[int], max_tokens: int, rounds: int, engine: str = "own") -> dict:
    """One engine alone: `bench_engines` with one column."""
    return bench_engines(model, [(engine, engine, 1)], levels, max_tokens, rounds)[engine]


def bench_engines(model: str, columns: list[tuple[str, str, int]], levels: list[int], max_tokens: int,
                  rounds: int) -> dict[str, dict]:
    """Each column (label, engine, data-parallel size) a server of its own, all started first;
    each round measures every column in turn, each at every level in turn (1 first), so drift in
    machine speed spreads over all alike. Figures are medians over rounds with their min and
    max; a speedup is taken within one round."""
    pattern = PATTERNS.get(model.partition(":")[0], DEFAULT_PATTERN)
    by_level = {c: {n: [] for n in levels} for c, _, _ in columns}
    speedups = {c: {n: [] for n in levels} for c, _, _ in columns}
    servers: dict[str, tuple[subprocess.Popen, str]] = {}
    with tempfile.TemporaryDirectory() as store:
        try:
            for label, engine, dp in columns:
                servers[label] = start_server(model, store, max(levels), engine, dp)
                asyncio.run(load(servers[label][1], max(2, dp), 4, 10_000, pattern))   # warm-up: compile, cache
            for rnd in range(rounds):
                for label, engine, dp in columns:
                    base = None
                    for i, n in enumerate(levels):
                        row = asyncio.run(load(servers[label][1], n, max_tokens, 1000 * (rounds * i + rnd), pattern))
                        by_level[label][n].append(row)
                        if n == levels[0]:
                            base = row["tokens_per_s"]
                        speedups[label][n].append(row["tokens_per_s"] / base)
                        print(f"{model:>10} {label:>8}  round {rnd + 1}  N={n:<3} {row['tokens_per_s']:8.1f} tokens/s  "
                              f"ttft p50 {row['ttft_p50_ms']:8.1f} ms  p99 {row['ttft_p99_ms']:8.1f} ms  "
                              f"errors {row['errors']}  ({row['tokens']} tokens in {row['wall_s']:.1f} s)",
                              file=sys.stderr, flush=True)
        finally:
            for proc, _ in servers.values():
                stop_server(proc)
    report = {}
    for label, engine, dp in columns:
        rows, ups = by_level[label], speedups[label]
        out: dict = {"model": model, "engine": engine, "data_parallel_size": dp, "max_tokens": max_tokens,
                     "rounds": rounds, "baseline_concurrency": levels[0], "concurrency": levels}
        for key in ("tokens_per_s", "ttft_p50_ms", "ttft_p99_ms"):
            out[key] = [round(median([r[key] for r in rows[n]]), 2) for n in levels]
        out["tokens_per_s_min"] = [round(min(r["tokens_per_s"] for r in rows[n]), 2) for n in levels]
        out["tokens_per_s_max"] = [round(max(r["tokens_per_s"] for r in rows[n]), 2) for n in levels]
        out["errors"] = [sum(r["errors"] for r in rows[n]) for n in levels]
        out["speedup"] = [round(median(ups[n]), 3) for n in levels]
        out["batching_efficiency"] = [round(median(ups[n]) * levels[0] / n, 3) for n in levels]
        largest = max(levels)
        out["largest_concurrency"] = largest
        out["batching_gain"] = round(median(ups[largest]), 3)
        out["error_samples"] = [s for n in levels for r in rows[n] for s in r["error_samples"]][:5]
        out["_rows"] = rows
        report[label] = out
    return report


def ratios(a: dict, b: dict, levels: list[int]) -> dict:
    """a's tokens/s over b's at each level: the median of the per-round ratios, and their min-max."""
    per = [[ra["tokens_per_s"] / rb["tokens_per_s"] if rb["tokens_per_s"] else float("nan")
            for ra, rb in zip(a["_rows"][n], b["_rows"][n])] for n in levels]
    return {"median": [round(median(p), 3) for p in per], "min": [round(min(p), 3) for p in per],
            "max": [round(max(p), 3) for p in per]}


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=None, help="comma-separated --model values [default: scripted,smollm2; "
                                                   "with --engine vllm: smollm2]")
    ap.add_argument("--engine", choices=["own", "vllm"], default="own",
                    help="vllm: each model on the own engine and on the vLLM engine, same run")
    ap.add_argument("--concurrency", default="1,8,32,64")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2, help="passes over the levels; figures are medians")
    ap.add_argument("--dp", type=int, default=2, help="with --engine vllm: also a column for "
                                                     "--data-parallel-size DP (0: none) [default: 2]")
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    if levels[0] != 1 or any(n < 1 for n in levels):
        ap.error(f"--concurrency must start with 1 (the baseline) and hold only N >= 1, got {args.concurrency}")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    models = (args.models or ("smollm2" if args.engine == "vllm" else "scripted,smollm2")).split(",")
    report: dict = {}
    extra: dict = {}
    for model in models:
        if args.engine == "own":
            report[model] = bench_model(model, levels, args.max_tokens, args.rounds)
            continue
        columns = [("own", "own", 1), ("vllm", "vllm", 1)] + ([(f"vllm-dp{args.dp}", "vllm", args.dp)]
                                                               if args.dp > 1 else [])
        got = bench_engines(model, columns, levels, args.max_tokens, args.rounds)
        own, on_vllm = got["own"], got["vllm"]
        extra["vllm_vs_own"] = ratios(on_vllm, own, levels)["median"]
        extra["vllm_vs_own_spread"] = ratios(on_vllm, own, levels)
        extra["own_tokens_per_s"] = own["tokens_per_s"]
        extra["own_errors"] = own["errors"]
        if args.dp > 1:
            dp = got[f"vllm-dp{args.dp}"]
            extra[f"dp{args.dp}_tokens_per_s"] = dp["tokens_per_s"]
            extra[f"dp{args.dp}_errors"] = dp["errors"]
            extra[f"dp{args.dp}_vs_vllm"] = ratios(dp, on_vllm, levels)
            extra[f"dp{args.dp}_vs_own"] = ratios(dp, own, levels)
        for label, r in got.items():
            report[f"{model}@{label}"] = r
        report[f"{model}@vllm"] = report.pop(f"{model}@vllm")     # last: the top-level figures
    for r in report.values():
        r.pop("_rows", None)
    last = report[list(report)[-1]]
    print(json.dumps({**{k: v for k, v in last.items() if k != "error_samples"}, **extra, "by_model": report}))

if __name__ == "__main__":
    main()
