"""Load on `aicirt serve`: N concurrent `/v1/run` streams, N in 1, 8, 32, 64, per model.

The server runs as its own process (`aicirt serve --model M` on 127.0.0.1, a fresh store), the
client here on one asyncio thread (httpx), so client and server do not share a GIL. Every
request runs the `regex` controller with a pattern that cannot end before `--max-tokens`
(greedy, distinct prompts), so each request samples the same number of tokens and N requests
do N times the work of one. One warm-up request first (compiles and caches the controller).

Figures per N (the baseline is N = 1, in the same run, against the same server):
- tokens_per_s: tokens sampled by all N requests over the wall time from the first request sent
  to the last stream ended;
- ttft_p50_ms / ttft_p99_ms: request sent -> first `run` object with text;
- errors: requests that did not end with status 200, `[DONE]` and no fork error;
- speedup: tokens_per_s at N / tokens_per_s at 1 (what batching buys over one at a time);
- batching_gain: tokens_per_s at N / (N x tokens_per_s at 1), the issue's measure: 1.0 means N
  streams cost no more per step than one (perfect batching), 1/N that they were served serially.

    python bench/server_load.py [--models scripted,smollm2] [--concurrency 1,8,32,64] [--max-tokens 32]

The last line is one JSON object: the last model's figures at top level (by default the real
model), each model's under its name.
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
PATTERN = "[a-z ]+\x01"        # complete only after a \\x01 byte no model picks: no early stop, masks cached


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, store: str, max_batch: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, str(ROOT / "cli.py"), "serve", "--model", model, "--port", str(port), "--store", store,
           "--max-batch", str(max_batch)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.monotonic() + 300
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
    raise TimeoutError("aicirt serve did not start within 300 s")


async def one_run(client, url: str, k: int, max_tokens: int) -> dict:
    body = {"controller": "regex", "controller_arg": PATTERN, "prompt": f"Write a line about topic {k}: ",
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


async def load(url: str, n: int, max_tokens: int, offset: int) -> dict:
    import httpx

    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600), limits=limits) as client:
        t0 = time.perf_counter()
        runs = await asyncio.gather(*[one_run(client, url, offset + k, max_tokens) for k in range(n)])
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


def bench_model(model: str, levels: list[int], max_tokens: int) -> dict:
    with tempfile.TemporaryDirectory() as store:
        proc, url = start_server(model, store, max(levels))
        try:
            asyncio.run(load(url, 1, 4, offset=10_000))              # warm-up: compile, cache
            rows = []
            for i, n in enumerate(levels):
                row = asyncio.run(load(url, n, max_tokens, offset=1000 * i))
                rows.append(row)
                print(f"{model:>10}  N={n:<3} {row['tokens_per_s']:8.1f} tokens/s  "
                      f"ttft p50 {row['ttft_p50_ms']:8.1f} ms  p99 {row['ttft_p99_ms']:8.1f} ms  "
                      f"errors {row['errors']}  ({row['tokens']} tokens in {row['wall_s']:.1f} s)",
                      file=sys.stderr, flush=True)
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    base = rows[0]["tokens_per_s"] if rows[0]["concurrency"] == 1 else float("nan")
    out = {"model": model, "max_tokens": max_tokens}
    for key in ("concurrency", "tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "errors"):
        out[key] = [round(r[key], 2) if isinstance(r[key], float) else r[key] for r in rows]
    out["speedup"] = [round(r["tokens_per_s"] / base, 3) for r in rows]
    out["batching_gain"] = [round(r["tokens_per_s"] / (r["concurrency"] * base), 3) for r in rows]
    out["error_samples"] = [s for r in rows for s in r["error_samples"]][:5]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="scripted,smollm2", help="comma-separated --model values")
    ap.add_argument("--concurrency", default="1,8,32,64")
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    report: dict = {}
    for model in args.models.split(","):
        report[model] = bench_model(model, levels, args.max_tokens)
    last = report[args.models.split(",")[-1]]
    print(json.dumps({**{k: v for k, v in last.items() if k != "error_samples"}, "by_model": report}))


if __name__ == "__main__":
    main()
