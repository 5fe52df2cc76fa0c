"""What a program check costs the caller: `aicirt.program.validate` (the `program` controller's first
call on the process's byte-tokenizer stand-in) side by side with the Python copy of the rules it
replaced (runtime/program/validate.py at --baseline-rev, loaded from git into this process).

Three typical programs: OpenAI tools rendered for the hermes family (two tools, JSON Schema
arguments, `required`), the JSON mode of docs/program.md (a schema inside a structural tag), and
a builder program (literal, select, regex, free text with a stop). Each check is of a program the
stand-in has not seen (a counter in a literal), so no remembered answer is used; then it
times the answer a repeated program gets (cached_us). Rounds alternate new and old; per check: wall µs and CPU
µs (process time: the worker thread that runs the call included), median and spread over rounds.
The one-time start (the stand-in runtime, the controller built and loaded) is timed once.

    .venv/bin/python bench/program_check.py [--rounds 5] [--checks 200] [--baseline-rev main]

The last line is one JSON object: check_us / check_cpu_us (new, median over rounds, by program),
baseline_us / baseline_cpu_us, ratio (new / old CPU), start_ms, cached_us, load.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent


def programs() -> dict[str, Callable[[int], dict]]:
    from aicirt import program as P
    from aicirt.program import tools as T

    tools = T.tools_from_openai([
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"]}}},
        {"type": "function", "function": {"name": "search", "parameters": {
            "type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}},
            "required": ["query"]}}}])
    calls = T.render(tools, "required", fam=T.HERMES, complete_by=256)
    person = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                               "tags": {"type": "array", "items": {"type": "string"}}},
              "required": ["name", "age"]}

    def tools_prog(i: int) -> dict:
        return {"type": "structural_tag", "format": {"type": "sequence", "elements": [
            {"type": "const_string", "value": f"#{i}"}, calls]}}

    def json_mode(i: int) -> dict:
        return P.structural_tag(P.seq(f"#{i} ", P.json(person)))

    def builder(i: int) -> dict:
        return P.seq(f"#{i} Answer: ", P.select(["yes", "no"], name="answer"), "\nBecause ",
                     P.gen(stop="\n", name="why", max_tokens=40), P.gen(regex="[0-9]{1,3}")).to_json()
    return {"tools": tools_prog, "json_mode": json_mode, "builder": builder}


def old_validator(rev: str) -> Any:
    """The Python copy at `rev`, as the module `aicirt.program._old_validate`."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:runtime/program/validate.py"],
                         capture_output=True, text=True, check=True).stdout
    spec = importlib.util.spec_from_loader("aicirt.program._old_validate", loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "aicirt.program"
    exec(compile(src, f"{rev}:runtime/program/validate.py", "exec"), mod.__dict__)
    return mod


def timed(check: Callable[[Any], None], make: Callable[[int], dict], base: int, n: int) -> tuple[float, float]:
    progs = [make(base + i) for i in range(n)]
    w0, c0 = time.perf_counter(), time.process_time()
    for p in progs:
        check(p)
    return (time.perf_counter() - w0) / n * 1e6, (time.process_time() - c0) / n * 1e6


def spread(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.1f} (min {min(xs):.1f}, max {max(xs):.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--checks", type=int, default=200)
    ap.add_argument("--baseline-rev", default="main")
    a = ap.parse_args()
    load0 = Path("/proc/loadavg").read_text().split()[:3]
    from aicirt.program import validate

    old = old_validator(a.baseline_rev)
    makes = programs()
    t0, c0 = time.perf_counter(), time.process_time()
    validate(makes["builder"](-1))             # the stand-in starts, the controller is built and loaded
    start_ms, start_cpu_ms = (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3
    print(f"load before: {' '.join(load0)}")
    print(f"start (stand-in runtime, controller built/loaded, first check): {start_ms:.1f} ms wall, "
          f"{start_cpu_ms:.1f} ms CPU")
    res: dict[str, dict[str, list[float]]] = {k: {"new": [], "new_cpu": [], "old": [], "old_cpu": []} for k in makes}
    base = 0
    for r in range(a.rounds):
        for name, make in makes.items():
            for who, check in (("new", validate), ("old", old.validate)):
                w, c = timed(check, make, base, a.checks)
                base += a.checks
                res[name][who].append(w)
                res[name][who + "_cpu"].append(c)
        print(f"round {r + 1}: " + "; ".join(
            f"{k} new {v['new'][-1]:.0f}/{v['new_cpu'][-1]:.0f} old {v['old'][-1]:.1f}/{v['old_cpu'][-1]:.1f}"
            for k, v in res.items()) + "  (µs wall/CPU a check)")
    cached = {}
    for name, make in makes.items():
        p = make(0)
        validate(p)
        w, _ = timed(lambda _p: validate(p), lambda i: p, 0, a.checks)
        cached[name] = round(w, 2)
    load1 = Path("/proc/loadavg").read_text().split()[:3]
    print()
    out: dict[str, Any] = {"check_us": {}, "check_cpu_us": {}, "baseline_us": {}, "baseline_cpu_us": {}, "ratio": {}}
    for name, v in res.items():
        print(f"{name}: controller check wall {spread(v['new'])} µs, CPU {spread(v['new_cpu'])} µs; "
              f"Python copy wall {spread(v['old'])} µs, CPU {spread(v['old_cpu'])} µs; "
              f"a repeated program (remembered answer) {cached[name]} µs")
        out["check_us"][name] = round(statistics.median(v["new"]), 1)
        out["check_cpu_us"][name] = round(statistics.median(v["new_cpu"]), 1)
        out["baseline_us"][name] = round(statistics.median(v["old"]), 1)
        out["baseline_cpu_us"][name] = round(statistics.median(v["old_cpu"]), 1)
        out["ratio"][name] = round(statistics.median(v["new_cpu"]) / statistics.median(v["old_cpu"]), 1)
    print(f"load after: {' '.join(load1)}")
    out.update({"start_ms": round(start_ms, 1), "cached_us": cached, "rounds": a.rounds, "checks": a.checks,
                "baseline_rev": a.baseline_rev, "load": [load0, load1], "python": sys.version.split()[0]})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
