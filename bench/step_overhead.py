"""Host overhead per sequence-step, side by side with the naive wasmtime-py path, in one run.

One sequence-step = allocate and write the argument through cabi_realloc, call mid-process, lift
the result, copy a 151,936-token mask (4,748 words) into the batch's mask array, call the
post-return. The controller does almost nothing (bench/controllers/static_mask.c), so what is
measured is the host.

The headline is what the caller's thread feels: `api_us_per_seq_b64` / `_b256`, the whole
`submit_rows -> wait` of a batch divided by its rows (Python included, 2 workers, the caller
running still-queued calls at wait as the runtime does by default); beside it, in the same run
and taking turns step by step, the object API (`apis`: rows, object with the whole
`--context`-token list and no hint, object with the `unchanged` hint, at batch 1, 64 and 256,
medians with the interquartile range; `object_vs_rows_b*`, target <= 2), the engine thread's own share (`engine_thread_us_per_seq_b256`:
submit + collect, the time blocked on workers and on calls it ran excluded) and the whole
process's CPU time for it (`api_cpu_us_per_seq_*`, all threads: on a loaded machine the wall
figures mostly measure waiting for a core).
`speedup_api` compares that whole with the naive path's (wasmtime-py's public API on the caller's
thread: also its whole). `overhead_us_*` is the inner figure, timed inside the worker. Also:
instantiate-per-sequence time (beside wasmtime-py's own path for the same instance,
`instantiate_naive_us`), fork time at 1 and 16 MiB of linear memory (untouched, and all written:
a fork copies what the parent changed), and batch-of-64 wall time with 1 vs 2 worker threads.

    python bench/step_overhead.py [--steps 200] [--batch 64] [--context 200]
    python bench/step_overhead.py --apis-only      # the object API vs the rows API only
    python bench/step_overhead.py --fork-only      # instantiate and fork only (instantiate_naive_us: its baseline)
    python bench/step_overhead.py --fork-only --rounds 3 --phases
    python bench/step_overhead.py --handoff        # one sequence's decode loop through the rows API

`--handoff`: one sequence, one worker, the rows API with the same `index` and `sampled` arrays
every step (as an engine fills them), `submit_rows` then `wait` at once (no forward pass to hide
the hand-off behind) for `--steps` x 100 steps: `handoff_us_p50/p90/p99` (the whole step, the
caller's wall), `handoff_submit_us_p50` (submit_rows alone), `handoff_call_us_p50` (the
controller's own call, `elapsed_us`). What is left beside the call is the runtime's cost of a step
at batch 1: Python and cffi on the caller, the hand-off to the worker and back.

`--fork-only` runs the instantiate and fork figures `--rounds` times under the default memory
policy (Limits.resident_bytes 0: a freed slot keeps nothing resident) alternating with the policy
before it (`resident_64mib`: freed slots keep 1 MiB each resident), and reports medians over the
rounds and `*_vs_resident` ratios (ours / that). `--phases` adds `fork_1mib_phases_us`: a 1 MiB
fork's median time in each of spawn.c's phases (its debug counters; compiled hot path only).

The last line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import time
from pathlib import Path

import numpy as np

import aicirt
from aicirt import StepInput
from aicirt.build.toolchain import build_cached

HERE = Path(__file__).resolve().parent

VOCAB = 151_936  # Qwen2's vocabulary


class FakeVocab:
    """The bench controller asks only for the vocabulary size."""
    vocab_size = VOCAB
    eos_token_id = 0
    token_bytes = [b""] * VOCAB

    def encode(self, text):
        return []

    def decode_bytes(self, ids):
        return b""


def pct(xs, q):
    return float(np.percentile(np.asarray(xs), q))


def bench_hot_path(rt, ctrl, batch, steps):
    """Per sequence-step time of the hot path, measured inside it."""
    seqs = [rt.new_request(ctrl).spawn() for _ in range(batch)]
    tokens = [[1, 2, 3] for _ in seqs]
    per_seq, per_step_wall = [], []
    for k in range(steps + 10):
        for t in tokens:
            t.append(k % 1000)
        t0 = time.perf_counter()
        out = rt.submit([StepInput(s, t, t[-1]) for s, t in zip(seqs, tokens)]).wait(5.0)   # returns when all are done
        wall = (time.perf_counter() - t0) * 1e6
        assert all(r.status == "ok" for r in out.results), out.results[0].error
        if k >= 10:  # warm-up: first calls process the prompt
            per_seq += [r.elapsed_us for r in out.results]
            per_step_wall.append(wall)
    for s in seqs:
        s.close()
    return per_seq, per_step_wall


def bench_api(rt, ctrl, batch, steps):
    """What the caller's thread feels per sequence through the rows API, Python included: the
    whole submit_rows -> wait of a batch of `batch` sequences, each row appending its sampled
    token; and the engine thread's own share: submit + collect, the time blocked on the workers
    excluded. Returns (whole us/seq per step, engine-thread us/seq per step, the whole process's
    CPU us/seq per step: workers, caller and their spinning, which a loaded machine does not
    inflate as it does wall time). The object API beside it: bench_apis."""
    seqs = [rt.new_request(ctrl).spawn() for _ in range(batch)]
    index = np.array([s.index for s in seqs], dtype=np.int64)
    whole, own, cpu = [], [], []
    for k in range(steps + 10):
        first = k == 0
        t0, c0 = time.perf_counter(), time.process_time()
        sampled = np.full(batch, k % 1000, dtype=np.int32)
        handle = rt.submit_rows(index, sampled, {i: ([1, 2, 3], 0) for i in range(batch)} if first else None)
        out = handle.wait(5.0)
        wall = (time.perf_counter() - t0) * 1e6
        used = (time.process_time() - c0) * 1e6
        if k >= 10:
            whole.append(wall / batch)
            own.append((wall - out.blocked_us) / batch)
            cpu.append(used / batch)
    for s in seqs:
        s.close()
    return pct(whole, 50), pct(own, 50), pct(cpu, 50)


API_KINDS = ("rows", "object", "object_hinted")


def bench_apis(rt, ctrl, batch, steps, context=200):
    """The rows API and the object API side by side in one run, per sequence-step, what the
    caller's thread feels (the whole submit -> wait, Python included): `rows` (`submit_rows`, the
    sampled token), `object` (`submit([StepInput(seq, tokens, sampled)])`: the whole list, no
    hint, as docs/embedding.md shows first) and `object_hinted` (the same with `unchanged`, as an
    engine that knows what it kept passes). Each API drives its own `batch` sequences whose lists
    are `context` tokens long, each row appending its sampled token; the three take turns step by
    step, in a rotating order, so that load drift hits all alike. Returns, per API, the median wall
    and process-CPU µs per sequence-step with the interquartile range, and the ratios to `rows`."""
    prompt = [1 + i % 1000 for i in range(context)]
    seqs = {api: [rt.new_request(ctrl).spawn() for _ in range(batch)] for api in API_KINDS}
    tokens = {api: [list(prompt) for _ in range(batch)] for api in API_KINDS}
    index = np.array([s.index for s in seqs["rows"]], dtype=np.int64)
    rt.submit_rows(index, np.full(batch, -1, np.int32), {i: (prompt, 0) for i in range(batch)}).wait(30.0)
    for api in ("object", "object_hinted"):
        rt.submit([StepInput(s, t) for s, t in zip(seqs[api], tokens[api])]).wait(30.0)
    wall: dict[str, list[float]] = {api: [] for api in API_KINDS}
    cpu: dict[str, list[float]] = {api: [] for api in API_KINDS}
    for k in range(steps + 5):
        tok = 1 + k % 1000
        for j in range(3):
            api = API_KINDS[(k + j) % 3]
            t0, c0 = time.perf_counter(), time.process_time()
            if api == "rows":
                out = rt.submit_rows(index, np.full(batch, tok, np.int32)).wait(30.0)
                ok = bool((out.kind == 0).all())
            else:
                hinted = api == "object_hinted"
                for t in tokens[api]:
                    t.append(tok)
                res = rt.submit([StepInput(s, t, tok, len(t) - 1 if hinted else None)
                                 for s, t in zip(seqs[api], tokens[api])]).wait(30.0)
                ok = all(r.status == "ok" for r in res.results)
            if k >= 5:   # warm-up
                wall[api].append((time.perf_counter() - t0) * 1e6 / batch)
                cpu[api].append((time.process_time() - c0) * 1e6 / batch)
            if not ok:
                raise RuntimeError(f"{api}: a row did not give its mask")
    for api in API_KINDS:
        for s in seqs[api]:
            s.close()
    out_: dict = {}
    for api in API_KINDS:
        out_[api] = {"us": round(pct(wall[api], 50), 2), "iqr_us": [round(pct(wall[api], 25), 2), round(pct(wall[api], 75), 2)],
                     "cpu_us": round(pct(cpu[api], 50), 2)}
    for api in ("object", "object_hinted"):
        out_[f"{api}_vs_rows"] = round(out_[api]["us"] / out_["rows"]["us"], 2)
        out_[f"{api}_vs_rows_cpu"] = round(out_[api]["cpu_us"] / out_["rows"]["cpu_us"], 2)
    return out_


def api_report(ctrl_path, steps: int, context: int, report: dict) -> None:
    """bench_apis at batch 1, 64 and 256 into `report` (`apis`, `object_vs_rows_b*`,
    `object_api_us_per_seq_b*`, `object_api_target_met`: object <= 2x rows at every size),
    printing a line per size."""
    report["apis"] = {}
    # 16 MiB a sequence: 3 x 256 of them within the default memory budget
    with aicirt.Runtime(FakeVocab(), limits=aicirt.Limits(memory_bytes=16 << 20), workers=2, cache_dir=False) as rt:
        ctrl = rt.load(ctrl_path)
        for b in (1, 64, 256):
            pair = report["apis"][f"b{b}"] = bench_apis(rt, ctrl, b, steps if b < 256 else max(40, steps // 2), context)
            report[f"object_api_us_per_seq_b{b}"] = pair["object"]["us"]
            report[f"object_vs_rows_b{b}"] = pair["object_vs_rows"]
            report[f"object_hinted_vs_rows_b{b}"] = pair["object_hinted_vs_rows"]
            print(f"batch {b:>3}: rows {pair['rows']['us']:7.2f} us/seq (IQR {pair['rows']['iqr_us']}), object "
                  f"{pair['object']['us']:7.2f} ({pair['object_vs_rows']}x; IQR {pair['object']['iqr_us']}), object "
                  f"with `unchanged` {pair['object_hinted']['us']:7.2f} ({pair['object_hinted_vs_rows']}x); CPU "
                  f"{pair['rows']['cpu_us']} / {pair['object']['cpu_us']} / {pair['object_hinted']['cpu_us']}",
                  flush=True)
    report["object_api_target_met"] = all(report[f"object_vs_rows_b{b}"] <= 2.0 for b in (1, 64, 256))


def bench_handoff(ctrl_path, steps: int) -> dict:
    """One sequence's decode loop through the rows API (see --handoff): percentiles in µs."""
    with aicirt.Runtime(FakeVocab(), limits=aicirt.Limits(memory_bytes=16 << 20), workers=1, cache_dir=False) as rt:
        seq = rt.new_request(rt.load(ctrl_path)).spawn()
        index, sampled = np.array([seq.index], np.int64), np.full(1, -1, np.int32)
        rt.submit_rows(index, sampled, {0: ([1, 2, 3], 0)}).wait(30.0)
        sampled[0] = 5
        whole, submit, call = np.empty(steps), np.empty(steps), np.empty(steps)
        clock = time.perf_counter
        for i in range(steps + 1000):
            reset = i and i % 4000 == 0   # its token list back to 3 tokens now and then (a bounded memory)
            t0 = clock()
            handle = rt.submit_rows(index, sampled, {0: ([1, 2, 3], 0)} if reset else None)
            t1 = clock()
            out = handle.wait()
            t2 = clock()
            if i >= 1000:   # warm-up left out
                k = i - 1000
                whole[k], submit[k], call[k] = (t2 - t0) * 1e6, (t1 - t0) * 1e6, float(out.elapsed_us[0])
    return {"handoff_steps": steps,
            **{f"handoff_us_p{q}": round(pct(whole, q), 2) for q in (50, 90, 99)},
            "handoff_submit_us_p50": round(pct(submit, 50), 2), "handoff_call_us_p50": round(pct(call, 50), 2)}


def bench_naive(ctrl_path, batch, steps):
    """The same protocol through wasmtime-py's public API: Func.__call__, Memory.read/write."""
    import wasmtime
    engine = wasmtime.Engine()
    module = wasmtime.Module.from_file(engine, str(ctrl_path))
    linker = wasmtime.Linker(engine)
    i32 = wasmtime.ValType.i32()
    linker.define_func("aici:controller/host@0.1.0", "vocab-size", wasmtime.FuncType([], [i32]), lambda: VOCAB)

    def arg(caller, ret):
        caller["memory"].write(caller, b"\0" * 8, ret)
    linker.define_func("aici:controller/host@0.1.0", "arg", wasmtime.FuncType([i32], []), arg, access_caller=True)
    words = (VOCAB + 31) // 32
    insts = []
    for _ in range(batch):
        store = wasmtime.Store(engine)
        inst = linker.instantiate(store, module)
        ex = inst.exports(store)
        insts.append((store, ex["memory"], ex["cabi_realloc"], ex["mid-process"], ex["cabi_post_mid-process"]))
    masks = np.zeros((batch, words), dtype=np.uint32)
    times = []
    for k in range(steps // 4 + 3):
        for row, (store, mem, realloc, mid, post) in enumerate(insts):
            t0 = time.perf_counter()
            ptr = realloc(store, 0, 0, 4, 4)
            mem.write(store, struct.pack("<I", k), ptr)
            res = mid(store, 0, ptr, 1, 1, k, 0, 0)
            bptr, n = struct.unpack("<II", mem.read(store, res, res + 8))
            b = mem.read(store, bptr, bptr + 28)
            mptr, mlen = struct.unpack_from("<II", b, 4)
            masks[row] = np.frombuffer(mem.read(store, mptr, mptr + mlen * 4), dtype=np.uint32)
            post(store, res)
            if k >= 3:
                times.append((time.perf_counter() - t0) * 1e6)
    return times


def bench_instantiate(rt, ctrl, n=300, cpu=None):
    """Wall µs of each spawn on the caller's thread (`cpu`: a list that gets its CPU µs too)."""
    req = rt.new_request(ctrl)
    times = []
    for _ in range(n):
        t0, c0 = time.perf_counter(), time.thread_time()
        s = req.spawn()
        times.append((time.perf_counter() - t0) * 1e6)
        if cpu is not None:
            cpu.append((time.thread_time() - c0) * 1e6)
        s.close()
    return times


def bench_fork(rt, ctrl, mib, n=50, reuse_slots=True, dirty=False, cpu=None):
    """Fork a parent whose linear memory is `mib` MiB (with `dirty`, every byte of it written).
    With `reuse_slots`, each child is closed before the next fork, so the pooled slot it gets is
    resident (a serving steady state); otherwise every child takes a never-used slot and pays its
    page faults."""
    parent = rt.new_request(ctrl).spawn()
    pages = mib * 16 - parent.memory.size(parent.store)
    if pages > 0:
        parent.memory.grow(parent.store, pages)
    if dirty:
        start = 1 << 16   # past the controller's own data and stack
        parent.memory.write(parent.store, b"\x5a" * (parent.memory.data_len(parent.store) - start), start)
    times, children = [], []
    for _ in range(n):
        t0, c0 = time.perf_counter(), time.thread_time()
        children.extend(parent.fork_many(1))
        times.append((time.perf_counter() - t0) * 1e6)
        if cpu is not None:
            cpu.append((time.thread_time() - c0) * 1e6)
        if reuse_slots:
            children.pop().close()
    for child in children:
        child.close()
    parent.close()
    return times


def bench_instantiate_naive(rt, ctrl, n=300):
    """The baseline: wasmtime-py's public path for the same instance (a Store with the same
    limit, InstancePre.instantiate, the export map), as the runtime did it before."""
    import wasmtime
    pre = rt.instance_pre(ctrl)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        store = wasmtime.Store(rt.engine)
        store.set_limits(memory_size=rt.limits.memory_bytes)
        ex = pre.instantiate(store).exports(store)
        _ = [ex[name] for name in ("memory", "cabi_realloc", "mid-process")]
        times.append((time.perf_counter() - t0) * 1e6)
        store.close()
    return times


def fork_instantiate_report(ctrl_path, limits) -> dict:
    """Instantiate and fork, median wall time on the caller's thread (µs), with wasmtime-py's bare
    instantiate as a same-run reference; `*_cpu_us`: the caller's CPU time for the same (on a
    loaded machine the wall figure is mostly waiting for a core)."""
    report = {}
    with aicirt.Runtime(FakeVocab(), limits=limits, workers=1, cache_dir=False) as rt:
        ctrl = rt.load(ctrl_path)
        cpu_inst, cpu_fork = [], []
        report["instantiate_us"] = pct(bench_instantiate(rt, ctrl, cpu=cpu_inst), 50)
        report["instantiate_cpu_us"] = pct(cpu_inst, 50)
        report["instantiate_naive_us"] = pct(bench_instantiate_naive(rt, ctrl), 50)
        report["fork_1mib_us"] = pct(bench_fork(rt, ctrl, 1, cpu=cpu_fork), 50)
        report["fork_1mib_cpu_us"] = pct(cpu_fork, 50)
        report["fork_16mib_us"] = pct(bench_fork(rt, ctrl, 16, n=20), 50)
        report["fork_16mib_dirty_us"] = pct(bench_fork(rt, ctrl, 16, n=10, dirty=True), 50)
        report["fork_1mib_fresh_slot_us"] = pct(bench_fork(rt, ctrl, 1, n=50, reuse_slots=False), 50)
    # ours / wasmtime-py's bare path: what a Sequence adds (its slot, Store binding, registry) and saves (the export map)
    report["instantiate_vs_naive"] = report["instantiate_us"] / report["instantiate_naive_us"]
    return report


FORK_FIELDS = ("instantiate_us", "fork_1mib_us", "fork_16mib_us", "fork_16mib_dirty_us", "fork_1mib_fresh_slot_us")
PHASES = ("store", "instantiate", "exports", "grow", "copy", "globals", "record")   # spawn.c's PH_* order


def fork_ab_report(ctrl_path, limits, rounds: int) -> dict:
    """fork_instantiate_report under `limits` and under the same with freed slots keeping memory
    resident (Limits.resident_bytes 64 MiB), alternating, `rounds` times each: medians per field."""
    import dataclasses
    import statistics
    resident = dataclasses.replace(limits, resident_bytes=64 << 20)
    runs: dict[str, list[dict]] = {"ours": [], "resident": []}
    for i in range(rounds):
        for name in (("ours", "resident") if i % 2 == 0 else ("resident", "ours")):
            runs[name].append(fork_instantiate_report(ctrl_path, limits if name == "ours" else resident))
    med = {name: {k: statistics.median(r[k] for r in got) for k in got[0]} for name, got in runs.items()}
    report = dict(med["ours"])
    report["resident_64mib"] = {k: round(v, 3) for k, v in med["resident"].items()}
    for k in FORK_FIELDS:
        report[k.removesuffix("_us") + "_vs_resident"] = med["ours"][k] / med["resident"][k]
    report["rounds"] = rounds
    return report


def fork_phases(ctrl_path, limits, n: int = 100) -> dict:
    """Median µs of each of spawn.c's phases over `n` forks of a 1 MiB parent (each child closed
    before the next fork), from its debug counters."""
    import statistics
    with aicirt.Runtime(FakeVocab(), limits=limits, workers=1, cache_dir=False) as rt:
        lib, ffi = rt.native.impl.lib, rt.native.ffi
        parent = rt.new_request(rt.load(ctrl_path)).spawn()
        parent.memory.grow(parent.store, 16 - parent.memory.size(parent.store))
        out, got = ffi.new("uint64_t[14]"), []
        for _ in range(n):
            lib.aicirt_spawn_timing(1, ffi.NULL)
            t0 = time.perf_counter()
            child = parent.fork_many(1)[0]
            wall = (time.perf_counter() - t0) * 1e6
            lib.aicirt_spawn_timing(0, out)
            got.append([out[k] / 1e3 for k in range(len(PHASES))] + [wall])
            child.close()
        parent.close()
    med = {name: statistics.median(g[k] for g in got) for k, name in enumerate(PHASES)}
    med["wall"] = statistics.median(g[-1] for g in got)
    med["python_and_rest"] = statistics.median(g[-1] - sum(g[:-1]) for g in got)
    return {k: round(v, 2) for k, v in med.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--work", type=int, default=200000, help="busy-work rounds per call for the 1-vs-2 workers run")
    ap.add_argument("--context", type=int, default=200, help="tokens in each sequence's list (the API comparison)")
    ap.add_argument("--apis-only", action="store_true", help="only the object API vs rows API comparison")
    ap.add_argument("--fork-only", action="store_true", help="only the instantiate and fork figures")
    ap.add_argument("--rounds", type=int, default=2, help="--fork-only: rounds of each memory policy, alternating")
    ap.add_argument("--phases", action="store_true", help="--fork-only: a 1 MiB fork's time by phase (compiled)")
    ap.add_argument("--handoff", action="store_true", help="only one sequence's step at batch 1 (rows API, 1 worker)")
    args = ap.parse_args()
    ctrl_path = build_cached(HERE / "controllers" / "static_mask.c", sdk=False)
    limits = aicirt.Limits(memory_bytes=64 << 20)
    if args.fork_only:
        report = fork_ab_report(ctrl_path, limits, args.rounds)
        if args.phases:
            report["fork_1mib_phases_us"] = fork_phases(ctrl_path, limits)
        print(f"instantiate {report['instantiate_us']:.1f} us, fork 1 MiB {report['fork_1mib_us']:.1f} us, "
              f"16 MiB {report['fork_16mib_us']:.1f} us ({report['fork_16mib_dirty_us']:.1f} us all written); "
              f"with freed slots keeping 1 MiB resident: {report['resident_64mib']['instantiate_us']:.1f}, "
              f"{report['resident_64mib']['fork_1mib_us']:.1f}, {report['resident_64mib']['fork_16mib_us']:.1f} us "
              f"(medians of {args.rounds} rounds each, alternating)")
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in report.items()}))
        return
    report = {"vocab": VOCAB, "batch": args.batch, "context": args.context, "loadavg_before": os.getloadavg()}
    if args.handoff:
        report.update(bench_handoff(ctrl_path, args.steps * 100))
        report["loadavg_after"] = os.getloadavg()
        print(f"batch 1, rows API, 1 worker: step p50 {report['handoff_us_p50']} us (p90 {report['handoff_us_p90']}, "
              f"p99 {report['handoff_us_p99']}); submit_rows {report['handoff_submit_us_p50']}, the call "
              f"{report['handoff_call_us_p50']}")
        print(json.dumps(report))
        return
    if args.apis_only:
        api_report(ctrl_path, args.steps, args.context, report)
        report["loadavg_after"] = os.getloadavg()
        print(json.dumps(report))
        return

    with aicirt.Runtime(FakeVocab(), limits=limits, workers=1, cache_dir=False) as rt:
        ctrl = rt.load(ctrl_path)
        report["hot_path"] = rt.native.mode
        per_seq, wall = bench_hot_path(rt, ctrl, args.batch, args.steps)
        report["overhead_us_median"] = pct(per_seq, 50)
        report["overhead_us_p99"] = pct(per_seq, 99)

    report.update(fork_instantiate_report(ctrl_path, limits))

    # What the caller feels: the whole submit -> wait, the runtime's default 2 workers; the two
    # APIs side by side (api_report), then the rows API's engine-thread share (bench_api).
    api_report(ctrl_path, args.steps, args.context, report)
    with aicirt.Runtime(FakeVocab(), limits=limits, workers=2, cache_dir=False) as rt:
        ctrl = rt.load(ctrl_path)
        for b in (64, 256):
            report[f"api_us_per_seq_b{b}"], own, cpu = bench_api(rt, ctrl, b, args.steps)
            report[f"engine_thread_us_per_seq_b{b}"] = own
            report[f"api_cpu_us_per_seq_b{b}"] = cpu

    naive = bench_naive(ctrl_path, args.batch, args.steps)
    report["naive_us_median"] = pct(naive, 50)
    report["naive_us_p99"] = pct(naive, 99)
    report["speedup"] = report["naive_us_median"] / report["overhead_us_median"]
    report["speedup_api"] = report["naive_us_median"] / report["api_us_per_seq_b64"]   # both: the caller's wall

    busy_arg = struct.pack("<I", args.work)
    for workers in (1, 2):
        with aicirt.Runtime(FakeVocab(), limits=limits, workers=workers, cache_dir=False) as rt:
            ctrl = rt.load(ctrl_path)
            seqs = [rt.new_request(ctrl, arg=busy_arg).spawn() for _ in range(args.batch)]
            walls = []
            for k in range(40):
                t0 = time.perf_counter()
                rt.submit([StepInput(s, [1, k], k) for s in seqs]).wait(1.0)
                walls.append((time.perf_counter() - t0) * 1e3)
            report[f"batch64_busy_ms_{workers}_workers"] = pct(walls[5:], 50)
    report["two_worker_speedup"] = report["batch64_busy_ms_1_workers"] / report["batch64_busy_ms_2_workers"]

    print(f"whole submit -> wait on the caller's thread, rows API: {report['api_us_per_seq_b64']:.2f} us/seq at "
          f"batch 64, {report['api_us_per_seq_b256']:.2f} at 256 (object API {report['object_api_us_per_seq_b64']:.2f} / "
          f"{report['object_api_us_per_seq_b256']:.2f}); the engine thread's own share at 256: "
          f"{report['engine_thread_us_per_seq_b256']:.2f} us/seq")
    print(f"inside the worker ({report['hot_path']}): {report['overhead_us_median']:.2f} us/seq-step median, "
          f"p99 {report['overhead_us_p99']:.2f}")
    print(f"naive wasmtime-py (whole, on the caller's thread): {report['naive_us_median']:.1f} us median -> "
          f"{report['speedup_api']:.0f}x the rows API's whole (inner: {report['speedup']:.0f}x)")
    print(f"instantiate {report['instantiate_us']:.1f} us (wasmtime-py's path {report['instantiate_naive_us']:.1f}); "
          f"fork 1 MiB {report['fork_1mib_us']:.1f} us ({report['fork_1mib_fresh_slot_us']:.1f} us into a never-used "
          f"slot), 16 MiB {report['fork_16mib_us']:.1f} us ({report['fork_16mib_dirty_us']:.1f} us all written)")
    print(f"batch of {args.batch} busy controllers: 1 worker {report['batch64_busy_ms_1_workers']:.2f} ms, "
          f"2 workers {report['batch64_busy_ms_2_workers']:.2f} ms (cores: {os.cpu_count()})")
    report["loadavg_after"] = os.getloadavg()
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in report.items()}))


if __name__ == "__main__":
    main()
