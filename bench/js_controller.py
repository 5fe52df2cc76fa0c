"""The js controller (controllers/js) against the C `regex` controller on the same pattern, same run.

Three sides: C `regex`; controllers/js/examples/regex.js (aici.Follower over the native
aici.Regex: one native call a step); regex_by_hand.js (the same loop written in JS). All on
Qwen2's tokenizer (151,851 ids), each loaded once with its per-tokenizer init snapshot (the JS
interpreter and its API are made by the init, so a request starts from an initialized
interpreter; its script is evaluated on the request's first call).

  ttfm_ms       new request to first mask: Runtime.new_request + spawn + the first call (the
                prompt; the JS side evaluates its script there) until the mask is in the batch's
                array; wall, and this process's CPU (all threads) as ttfm_cpu_ms.
  step_us_p50   one step inside the controller (StepResult.elapsed_us: the worker's mid-process
                call, wall, with the mask lifted into the batch row) along the pattern's text
                (`194`), each state new to the instance: its mask is computed (the same native
                code on every side); median.
  step_cached_us_p50  the same steps again after backtracking to the prompt: every mask cached
                in the instance, so this is the controller's own cost a step (for JS: the
                interpreter, the argument and result conversion); median.
  step_cached_cpu_us  those cached steps repeated (25 times a request), in this process's CPU
                per step (all threads: the call and the runtime around it); median over
                requests. `step_cached_cpu_extra_us`: JS less C, what the interpreter adds.
  fork_us       Sequence.fork() of a sequence after its first call (a fresh instance, then the
                4 KiB pages the parent wrote copied where they differ), median, wall.
  memory_mib    the instance's linear memory after the first call, MiB (its address space; a
                fork copies only what the parent wrote).

Rounds alternate the sides. Ratios are JS / C of medians in this run (`ratio`: regex.js,
`ratio_by_hand`). The last line is one JSON object: {"ttfm_ms", "step_us_p50",
"step_cached_us_p50", "fork_us", "memory_mib" (regex.js), "c": {...}, "js_by_hand": {...},
"ratio": {...}, "ratio_by_hand": {...}, ...}.

`--bind-load`: instead, the cost of loading a script bound to the js module (`aicirt upload
ctrl.js`): the js module, then two bound scripts, each Runtime.load'ed in a fresh runtime without
the disk cache; wall and CPU (this process and its compile children). Last line: one JSON object
{"js_load_cpu_s", "bound_load_cpu_s": [...], "bound_load_wall_s": [...]}.

`--resident-bytes N`: Limits.resident_bytes for the runtime (default 0, the runtime's default: a
freed slot keeps nothing resident; 67108864 is the policy before, freed slots keeping 1 MiB each),
for an A/B of the memory policy in separate runs.

`--library`: instead, the async library (controllers/js/lib.js) against the same jobs written by
hand against the low-level midProcess API (controllers/js/examples/library/*_by_hand.js), same
run, alternating, on Qwen2's tokenizer, every capability granted, driven by a small engine loop
here (the scripted text's next token where the mask allows it, splices applied, forks followed):
  choice50   gen({options}) over 50 city names, the 38th generated
  regex_stop gen({regex, stopAt, maxTokens}) along a sentence, stopped at ". "
  fork3      fork(4) (the parent and 3 children), each child appends its option and sets a
             variable, the parent waitVars() for all three
Per job and side: ttfm_ms (new request to the first call's result; for fork3 that call forks),
ttfm_cpu_ms, step_us_p50 (StepResult.elapsed_us of every later call, all sequences),
fork_us (Sequence.fork() after the first call), memory_mib, calls. Last line: one JSON object
{"jobs": {job: {"library": {...}, "by_hand": {...}, "ratio": {...}}}, "targets": {...}}.

`--init`: instead, aici.init (the per-tokenizer init for scripts) on Qwen2's tokenizer, two jobs:
  table      group the vocabulary's 151,851 ids by their first byte in `aici.init(fn)` (one
             tokenBytes call a token, in JS), sample from one group
  choice50   `aici.choice` of the 50 cities and its first mask made in `aici.init(fn)` (the mask is
             cached in the Regex), return that mask
each bound into the module (`bound`: the init evaluates it, once, into the module's own snapshot)
against the same script given as the argument (`argument`: evaluated, init and all, on every
request's first call), alternating. Per job and side: first_call_ms (new request to the first
call's result, wall), first_call_cpu_ms (this process's CPU), spread; per job the bound module's
load (the init and the snapshot's compile, once: wall and CPU, compile children included). Last
line: one JSON object {"jobs": {job: {"bound", "argument", "ratio" (bound / argument),
"bound_load_s"}}, ...}.

Usage: python bench/js_controller.py [--rounds N] [--resident-bytes N] [--bind-load | --library | --init]
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
CYCLES = 25          # repeats of the cached steps timed in CPU
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
    digits = tok.encode(TEXT)

    def step(tokens: list[int], sampled: int | None) -> tuple[object, object]:
        out = rt.submit([StepInput(seq, tokens, sampled)]).wait()
        r = out.results[0]
        if r.status != "ok":
            raise RuntimeError(f"step failed: {r.error}")
        return out, r

    def follow(out, r, toks: list[int]) -> tuple[list[float], object, object]:
        times, tokens = [], list(prompt)
        for t in toks:
            if not r.branches or not out.masks[r.branches[0].mask_row][t // 32] >> (t % 32) & 1:
                raise RuntimeError(f"token {t} not allowed")
            tokens.append(t)
            out, r = step(tokens, t)
            times.append(r.elapsed_us)
        return times, out, r

    # all but the last digit (which completes the match and stops): masks of states new to this
    # instance; then back to the prompt and the same again: masks cached in the instance
    first, out, r = follow(out, r, digits[:-1])
    out, r = step(list(prompt), None)
    cached, out, r = follow(out, r, digits[:-1])
    # the same cached steps, CYCLES times, timed in this process's CPU (all threads: the call on
    # the worker and the runtime's own work around it), which a loaded machine does not inflate
    c0 = time.process_time()
    for _ in range(CYCLES):
        out, r = step(list(prompt), None)
        _, out, r = follow(out, r, digits[:-1])
    cached_cpu_us = (time.process_time() - c0) * 1e6 / (CYCLES * len(digits))
    _, out, r = follow(out, r, digits[-1:])
    if r.branches:
        raise RuntimeError("the controller did not stop after a complete match")
    seq.close()
    req.close()
    return {"ttfm_ms": ttfm, "ttfm_cpu_ms": ttfm_cpu, "fork_us": fork_us, "memory_mib": memory_mib,
            "steps": first, "cached_steps": cached, "cached_cpu_us": cached_cpu_us}


CITIES = ["Tokyo", "Delhi", "Shanghai", "Sao Paulo", "Mexico City", "Cairo", "Mumbai", "Beijing", "Dhaka", "Osaka",
          "New York", "Karachi", "Buenos Aires", "Chongqing", "Istanbul", "Kolkata", "Manila", "Lagos",
          "Rio de Janeiro", "Tianjin", "Kinshasa", "Guangzhou", "Los Angeles", "Moscow", "Shenzhen", "Lahore",
          "Bangalore", "Paris", "Bogota", "Jakarta", "Chennai", "Lima", "Bangkok", "Seoul", "Nagoya", "Hyderabad",
          "London", "Tehran", "Chicago", "Chengdu", "Nanjing", "Wuhan", "Ho Chi Minh City", "Luanda", "Ahmedabad",
          "Kuala Lumpur", "Xi'an", "Hong Kong", "Dongguan", "Hangzhou"]
LIB_JOBS = {   # job: (script stem, argument, the text the engine loop follows)
    "choice50": ("gen", json.dumps({"options": CITIES, "storeVar": "city"}), CITIES[37]),
    "regex_stop": ("gen", json.dumps({"regex": "[A-Za-z ,.]+", "stopAt": ". ", "maxTokens": 64, "storeVar": "s"}),
                   "The war in Europe ended in May, and in Asia it ended in September. Then"),
    "fork3": ("fork", "red\ngreen\nblue", ""),
}


def drive(rt, ctrl, arg: bytes, tok, prompt: list[int], text: str) -> dict:
    """One request run to its end by a small engine loop: each sequence samples the next token of
    `prompt + text` where its mask allows it (else the lowest allowed; EOS once the text is
    spent), splices apply as an engine applies them, forks are followed."""
    from aicirt import StepInput
    from aicirt.core.results import splice_for
    script = list(prompt) + tok.encode(text)
    eos = tok.eos_token_id
    c0, t0 = time.process_time(), time.perf_counter()
    req = rt.new_request(ctrl, arg=arg)
    seq = req.spawn()
    out = rt.submit([StepInput(seq, list(prompt), None)]).wait()
    ttfm, ttfm_cpu = (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3
    memory_mib = seq.memory.data_len(seq.store) / (1 << 20)
    steps, calls, fork_us = [], 1, None
    state = {seq: list(prompt)}
    while True:
        todo = []
        for r in out.results:
            if r.status != "ok":
                raise RuntimeError(f"{r.status}: {r.error} {r.seq.log[-300:]!r}")
            toks = state.pop(r.seq)
            if not r.branches:
                r.seq.close()
                continue
            if fork_us is None and len(r.branches) == 1 and r.seq is seq:   # Sequence.fork() once, idle
                t1 = time.perf_counter()
                seq.fork().close()
                fork_us = (time.perf_counter() - t1) * 1e6
            for i, b in enumerate(r.branches):
                s, t = (r.seq if i == 0 else r.forks[i - 1]), list(toks)
                sampled = None
                if b.mask_row is None:
                    sp = b.splices[0]
                else:
                    row = out.masks[b.mask_row]
                    ok = lambda x: row[x // 32] >> (x % 32) & 1
                    want = script[len(t)] if len(t) < len(script) else eos
                    sampled = want if ok(want) else next(x for x in range(len(row) * 32) if ok(x))
                    t.append(sampled)
                    sp = splice_for(b.splices, sampled)
                if sp is not None:
                    t = t[:len(t) - sp.backtrack] + list(sp.ff_tokens)
                state[s] = t
                todo.append(StepInput(s, t, sampled))
        if not todo:
            break
        out = rt.submit(todo).wait()
        calls += len(todo)
        steps += [r.elapsed_us for r in out.results]
    variables = dict(req.variables) if hasattr(req, "variables") else {}
    req.close()
    return {"ttfm_ms": ttfm, "ttfm_cpu_ms": ttfm_cpu, "memory_mib": memory_mib, "steps": steps, "calls": calls,
            "fork_us": fork_us, "variables": variables}


def library(rounds: int) -> None:
    from mask_speed import QwenTokenizer

    import aicirt
    from aicirt.build.toolchain import CONTROLLERS_DIR, build_cached
    tok = QwenTokenizer()
    limits = aicirt.Limits(first_call_timeout_s=30.0, call_timeout_s=5.0, soft_deadline_s=5.0, compile_timeout_s=300.0)
    rt = aicirt.Runtime(tok, limits=limits, workers=1, cache_dir=False)
    prompt = tok.encode("Name a city: ")
    lib = CONTROLLERS_DIR / "js" / "examples" / "library"
    js = rt.load(build_cached("js"))
    sides = {}
    for job, (stem, arg, text) in LIB_JOBS.items():
        for side, name in (("library", f"{stem}.js"), ("by_hand", f"{stem}_by_hand.js")):
            sides[job, side] = ((lib / name).read_bytes() + b"\0" + arg.encode(), text)
    for (job, side), (arg, text) in sides.items():   # warm-up
        for _ in range(2):
            drive(rt, js, arg, tok, prompt, text)
    got = {k: [] for k in sides}
    for i in range(rounds):
        for k in (list(sides) if i % 2 == 0 else list(sides)[::-1]):
            got[k].append(drive(rt, js, sides[k][0], tok, prompt, sides[k][1]))
    rt.close()

    def summary(runs):
        forks = [r["fork_us"] for r in runs if r["fork_us"] is not None]
        return {"ttfm_ms": round(statistics.median(r["ttfm_ms"] for r in runs), 3),
                "ttfm_cpu_ms": round(statistics.median(r["ttfm_cpu_ms"] for r in runs), 3),
                "ttfm_ms_spread": [round(min(r["ttfm_ms"] for r in runs), 3), round(max(r["ttfm_ms"] for r in runs), 3)],
                "step_us_p50": round(statistics.median(s for r in runs for s in r["steps"]), 2),
                "step_us_p90": round(statistics.quantiles([s for r in runs for s in r["steps"]], n=10)[-1], 2),
                "fork_us": round(statistics.median(forks), 1) if forks else None,
                "memory_mib": round(max(r["memory_mib"] for r in runs), 2),
                "calls": runs[0]["calls"]}
    jobs = {}
    for job in LIB_JOBS:
        a, b = summary(got[job, "library"]), summary(got[job, "by_hand"])
        vl, vh = got[job, "library"][0]["variables"], got[job, "by_hand"][0]["variables"]
        if vl != vh:
            raise RuntimeError(f"{job}: the library's variables {vl} differ from by hand's {vh}")
        ratio = {k: round(a[k] / b[k], 2) for k in ("ttfm_ms", "ttfm_cpu_ms", "step_us_p50", "fork_us", "memory_mib")
                 if a[k] and b[k]}
        jobs[job] = {"library": a, "by_hand": b, "ratio": ratio,
                     "variables": {k: v.decode(errors="replace") for k, v in vl.items()}}
        for side, s in (("library", a), ("by hand", b)):
            print(f"{job:10s} {side:8s} ttfm {s['ttfm_ms']:7.3f} ms ({s['ttfm_cpu_ms']:.3f} CPU, spread {s['ttfm_ms_spread']})"
                  f"  step p50 {s['step_us_p50']:7.2f} us (p90 {s['step_us_p90']:.2f})  fork {s['fork_us']} us"
                  f"  memory {s['memory_mib']:.2f} MiB  calls {s['calls']}", flush=True)
    print(json.dumps({"jobs": jobs, "rounds": rounds, "vocab": tok.vocab_size,
                      "targets": {"step_ratio_max": 1.5, "choice50_ttfm_ms_max": 5.0}}))


def bind_load() -> None:
    import resource

    import aicirt
    from aicirt.loader.js_bind import bind
    from aicirt.build.toolchain import build_cached
    from mask_speed import QwenTokenizer

    def cpu() -> float:
        s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

    rt = aicirt.Runtime(QwenTokenizer(), workers=1, cache_dir=False)
    js = build_cached("js").read_bytes()
    got = []
    for label, data in (("js", js), ("bound 1", bind(js, b"function midProcess(a) { return aici.stop(); } // 1")),
                        ("bound 2", bind(js, b"function midProcess(a) { return aici.stop(); } // 2"))):
        c0, t0 = cpu(), time.perf_counter()
        rt.load(data)
        got.append((time.perf_counter() - t0, cpu() - c0))
        print(f"{label:8s} load {got[-1][0]:7.2f} s wall, {got[-1][1]:6.2f} s CPU", flush=True)
    rt.close()
    print(json.dumps({"js_load_cpu_s": round(got[0][1], 2), "bound_load_cpu_s": [round(c, 2) for _, c in got[1:]],
                      "bound_load_wall_s": [round(w, 2) for w, _ in got[1:]]}))


INIT_SCRIPT = """
const byFirst = new Map();
aici.init(() => {
  for (let t = 0; t < aici.vocabSize(); t++) {
    const b = aici.tokenBytes(t);
    if (!b || !b.length) continue;
    let ids = byFirst.get(b[0]);
    if (!ids) byFirst.set(b[0], ids = []);
    ids.push(t);
  }
});
function midProcess(arg) {
  return aici.sample(new aici.TokenSet(byFirst.get(72)));   // the ids whose text starts with "H"
}
"""


# A choice among the 50 cities whose regex and first mask are made by aici.init (cached in the
# Regex, so in the bound module's snapshot): a request's first call returns that mask.
CHOICE_INIT_SCRIPT = """
const cities = aici.init(() => {
  const r = aici.choice(%s);
  r.mask(r.start());
  return r;
});
function midProcess(arg) {
  return aici.sample(cities.mask(cities.start()));
}
"""


def init_bench(rounds: int) -> None:
    import resource

    import aicirt
    from aicirt import StepInput
    from aicirt.loader.js_bind import bind
    from aicirt.build.toolchain import build_cached
    from mask_speed import QwenTokenizer

    def cpu() -> float:
        s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

    tok = QwenTokenizer()
    limits = aicirt.Limits(first_call_timeout_s=30.0, soft_deadline_s=30.0, compile_timeout_s=300.0)
    rt = aicirt.Runtime(tok, limits=limits, workers=1, cache_dir=False)
    js_bytes = build_cached("js").read_bytes()
    js = rt.load(js_bytes)
    prompt = tok.encode("Say hello: ")
    sides, loads = {}, {}
    for job, script in (("table", INIT_SCRIPT), ("choice50", CHOICE_INIT_SCRIPT % json.dumps(CITIES))):
        c0, t0 = cpu(), time.perf_counter()
        bound = rt.load(bind(js_bytes, script.encode()))
        loads[job] = {"wall": round(time.perf_counter() - t0, 2), "cpu": round(cpu() - c0, 2)}
        print(f"{job:8s} bound    load {loads[job]['wall']:.2f} s wall, {loads[job]['cpu']:.2f} s CPU "
              f"(the init and its snapshot, once)", flush=True)
        sides[job, "bound"] = (bound, b"")
        sides[job, "argument"] = (js, script.encode() + b"\0")

    def first_call(ctrl, arg: bytes) -> tuple[float, float]:
        c0, t0 = time.process_time(), time.perf_counter()
        req = rt.new_request(ctrl, arg)
        seq = req.spawn()
        r = rt.submit([StepInput(seq, list(prompt), None)]).wait().results[0]
        wall, c = (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3
        if r.status != "ok" or not r.branches:
            raise RuntimeError(f"no first mask: {r.status} {r.error}")
        seq.close()
        req.close()
        return wall, c

    for ctrl, arg in sides.values():   # warm-up
        first_call(ctrl, arg)
    got: dict[tuple[str, str], list[tuple[float, float]]] = {k: [] for k in sides}
    for i in range(rounds):
        for k in (list(sides) if i % 2 == 0 else list(sides)[::-1]):
            got[k].append(first_call(*sides[k]))
    rt.close()
    jobs: dict = {}
    for (job, side), runs in got.items():
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        s = jobs.setdefault(job, {})[side] = {
            "first_call_ms": round(statistics.median(walls), 3), "first_call_cpu_ms": round(statistics.median(cpus), 3),
            "first_call_ms_spread": [round(min(walls), 3), round(max(walls), 3)]}
        print(f"{job:8s} {side:8s} first call {s['first_call_ms']:9.3f} ms ({s['first_call_cpu_ms']:.3f} ms CPU, "
              f"spread {s['first_call_ms_spread']})", flush=True)
    for job, j in jobs.items():
        j["ratio"] = {m: round(j["bound"][m] / j["argument"][m], 4) for m in ("first_call_ms", "first_call_cpu_ms")}
        j["bound_load_s"] = loads[job]
    print(json.dumps({"jobs": jobs, "rounds": rounds, "vocab": tok.vocab_size, "targets": {"choice50_ttfm_ms_max": 5.0}}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--bind-load", action="store_true")
    ap.add_argument("--library", action="store_true", help="the async library against hand-written scripts")
    ap.add_argument("--init", action="store_true", help="aici.init: a bound script's init against per request")
    ap.add_argument("--resident-bytes", type=int, default=0, help="Limits.resident_bytes (the memory policy)")
    args = ap.parse_args()
    if args.library:
        return library(args.rounds)
    if args.init:
        return init_bench(args.rounds)
    if args.bind_load:
        return bind_load()
    from mask_speed import QwenTokenizer

    import aicirt
    from aicirt.build.toolchain import CONTROLLERS_DIR, build_cached

    tok = QwenTokenizer()
    # compile_timeout_s: the js module is compiled afresh each run (no disk cache), which takes
    # over the default 30 s on a loaded 2-core machine
    limits = aicirt.Limits(first_call_timeout_s=30.0, call_timeout_s=5.0, soft_deadline_s=5.0, compile_timeout_s=300.0,
                           resident_bytes=args.resident_bytes)
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
                "step_cached_us_p50": round(statistics.median(s for r in runs for s in r["cached_steps"]), 2),
                "step_cached_cpu_us": round(statistics.median(r["cached_cpu_us"] for r in runs), 2),
                "fork_us": round(statistics.median(r["fork_us"] for r in runs), 1),
                "memory_mib": round(max(r["memory_mib"] for r in runs), 2)}

    js, c, by_hand = summary(got["js"]), summary(got["c"]), summary(got["js_by_hand"])
    for name, s in (("c regex", c), ("js regex.js", js), ("js by hand", by_hand)):
        print(f"{name:12s} ttfm {s['ttfm_ms']:7.3f} ms ({s['ttfm_cpu_ms']:.3f} ms CPU)  step p50 "
              f"{s['step_us_p50']:7.2f} us (cached mask {s['step_cached_us_p50']:6.2f} us)  fork {s['fork_us']:8.1f} us  memory {s['memory_mib']:.2f} MiB")
    ratio = {k: round(js[k] / c[k], 2) if c[k] else None for k in c}
    ratio_by_hand = {k: round(by_hand[k] / c[k], 2) if c[k] else None for k in c}
    # what the interpreter adds to a cached step, in CPU: JS less C, same steps, same run
    extra = {"js": round(js["step_cached_cpu_us"] - c["step_cached_cpu_us"], 2),
             "js_by_hand": round(by_hand["step_cached_cpu_us"] - c["step_cached_cpu_us"], 2)}
    print(json.dumps({**js, "c": c, "ratio": ratio, "js_by_hand": by_hand, "ratio_by_hand": ratio_by_hand,
                      "step_cached_cpu_extra_us": extra, "pattern": PATTERN, "rounds": args.rounds,
                      "resident_bytes": args.resident_bytes,
                      "targets": {"ttfm_ms": 2.0, "step_cached_us_p50": 20.0, "fork_us": 500.0}}))


if __name__ == "__main__":
    main()
