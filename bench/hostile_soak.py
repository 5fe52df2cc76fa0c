"""Soak: tens of thousands of mixed hostile sequences through one Runtime beside healthy ones.

Hostile sequences come from the whole hostile suite, every kind, none left out
(tests/hostile/kinds.py and the JS kinds of tests/hostile/js_kinds.py, run in the js controller):
the loopers and spinners (each runs to the hard time limit), the floods (variables, log, host
calls), the memory touchers (48 MiB every call, malloc until the limit, JS memory bombs), traps,
bad pointers, invalid masks, refused capabilities, forks past the limit, legal oddities. `--live`
of them are in every batch, each replaced when it ends. The kinds that are not sequences (refused
at load) are loaded in their turn and count as one (each load refused as the suite expects);
`noop-forever`, which never ends, is aborted after `--max-hostile-steps` steps like any hostile
sequence still live then (as an engine's max_tokens would). `left_out` names a kind only when
`--kinds` or `--no-js` leaves it out. A kind's own limits, copies and respawns are the suite's
harness settings, not the soak's: here every kind runs once per round, under the soak's limits.

`--budget-touchers N` (40 by default; 0: skip) measures the memory budget instead first: N
requests of a controller that grows its memory to 64 MiB and writes every page, in one Runtime
with `Limits.memory_budget_bytes` = `--budget-mib` (1024), as a server admits them (a request
waits while the budget has no room, and starts when a sequence ends); peak RSS against the
budget (target: at most budget + 15 %), and the same N with no budget in a child process, as the
baseline.

Beside them two healthy requests run round after round; every round's output is compared with
the output the same requests give alone. RSS is read after warm-up and at each checkpoint, each
time after the hostile sequences in flight have finished and the runtime has idled `--idle`
seconds (so the figure is what the runtime keeps, not what live sequences use: a live memory
toucher alone holds 48 MiB); `rss_busy_mb` is the same before the idle. "Finished" includes the
calls of sequences closed mid-call (the aborted ones): their calls, queued behind stuck ones,
still run to their own limits, so each reading first waits for them (`close_waits_s_and_left`:
how long, and how many were left at `--close-wait`), collecting them (`Runtime.collect`). The baseline in the same
run: healthy rounds alone, for as many steps as warm-up.

    python bench/hostile_soak.py                       # checkpoints at 10,000 and 50,000 sequences
    python bench/hostile_soak.py --sequences 2000 --warmup 500
    python bench/hostile_soak.py --kinds 'flood|memory' --sequences 3000 --warmup 500   # one family: a fast reproducer
    python bench/hostile_soak.py --per-kind 64 --per-kind-only --budget-touchers 0  # which kinds leave memory behind
    python bench/hostile_soak.py --smaps ...          # where the RSS is, by kind of mapping, at each checkpoint

Last line: one JSON object (sequences, rss_warm_mb, checkpoints with RSS after N and after the
idle, growth_pct and the C heap's in-use and free bytes, rss_growth_pct, rss_after_close_mb,
healthy_ok, healthy_total, left_out, per_kind, ...).
Target (issue 10, and the memory issue): rss_growth_pct <= 10 after a few seconds of idle and
every healthy output correct.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from hostile.js_kinds import JS_KINDS  # noqa: E402
from hostile.kinds import KINDS  # noqa: E402
from hostile.runner import Spec, healthy_specs, run_batch  # noqa: E402

import aicirt  # noqa: E402
from aicirt.build import toolchain  # noqa: E402
from aicirt.core.memory import cap_malloc_arenas, heap_stats, pin_malloc_thresholds, trim_heap  # noqa: E402
from aicirt.testing import Choices, EngineSettings, FuzzEngine  # noqa: E402


def rss_mb() -> tuple[float, float]:
    """(current, peak) resident set size in MiB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


@dataclass(frozen=True)
class Hostile:
    name: str
    spec: Spec
    load_only: bool = False          # refused at load: loaded in its turn, never a sequence


def top_mappings(n: int = 6) -> list[str]:
    """The `n` mappings of this process holding the most resident memory (MiB, name): where the
    RSS is, for --smaps."""
    out, cur = [], None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        parts = line.split()
        if parts and "-" in parts[0] and len(parts) >= 5 and not parts[0].endswith(":"):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            cur = [0.0, f"{(hi - lo) >> 20} MiB map {parts[5] if len(parts) > 5 else '[anon]'}"]
            out.append(cur)
        elif parts and parts[0] == "Rss:" and cur is not None:
            cur[0] = int(parts[1]) / 1024
    out.sort(key=lambda m: -m[0])
    return [f"{rss:.1f} MiB in {name}" for rss, name in out[:n]]


def rss_by_kind() -> dict[str, float]:
    """This process's resident memory by kind of mapping (MiB): the C heap's main arena ([heap]),
    the wasm pool's slots (anonymous reservations of 1 GiB or more) and module images (memfd),
    other anonymous memory (Python's arenas, numpy, thread stacks, large malloc chunks), libraries
    and other files: where a growth is, for --smaps."""
    out: dict[str, float] = {}
    kind = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        parts = line.split()
        if parts and "-" in parts[0] and len(parts) >= 5 and not parts[0].endswith(":"):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            name = parts[5] if len(parts) > 5 else ""
            kind = ("heap" if name == "[heap]" else "wasm_images" if name.startswith("/memfd:")
                    else "wasm_slots" if not name and hi - lo >= 1 << 30 else "anon" if not name or name == "[stack]"
                    else "libs" if ".so" in name else "files")
        elif parts and parts[0] == "Rss:" and kind is not None:
            out[kind] = out.get(kind, 0.0) + int(parts[1]) / 1024
    return {k: round(v, 1) for k, v in sorted(out.items())}


def soak_kinds(hostile_c, js_wasm, only: str | None = None) -> tuple[list[Hostile], dict[str, str]]:
    """(the kinds in the mix, {kind left out: why}); `only`: a regular expression the names of the
    kinds kept must contain a match of (the others are left out as "not selected"); `js_wasm`
    None leaves the JS kinds out."""
    kinds, left_out = [], {}
    for k in KINDS:
        if only is not None and not re.search(only, k.name):
            left_out[k.name] = "not selected (--kinds)"
        else:
            kinds.append(Hostile(k.name, Spec(k.wasm if k.wasm is not None else hostile_c, k.arg,
                                              capabilities=k.capabilities), k.expect.startswith("load:")))
    for j in JS_KINDS:
        name = "js-" + j.name
        if js_wasm is None:
            left_out[name] = "--no-js"
        elif only is not None and not re.search(only, name):
            left_out[name] = "not selected (--kinds)"
        else:
            kinds.append(Hostile(name, Spec(js_wasm, j.script.encode() + b"\0", prompt=(65, 66))))
    return kinds, left_out


class Soak:
    def __init__(self, rt, healthy: list[Spec], hostile: list[Hostile], live: int, max_hostile_steps: int = 64):
        self.rt, self.healthy, self.hostile, self.live = rt, healthy, hostile, live
        self.max_hostile_steps = max_hostile_steps
        self.born: dict[str, int] = {}         # hostile label -> the step it was added at
        self.refused_loads = self.aborted = 0
        self.unexpected_loads: list[str] = []
        self.close_waits: list[tuple[float, int]] = []   # (s waited for closed-mid-call calls, still closing)
        self.engine = FuzzEngine(rt, lambda label: Choices(replay=[]), Choices(replay=[]), EngineSettings(max_tokens=8))
        self.ctrls = {}
        self.spawned = self.rounds = self.healthy_ok = self.healthy_total = 0
        self.reference: dict | None = None
        self.round_tracks: list = []
        self.mismatches: list[dict] = []       # the first few healthy rounds that went wrong

    def _ctrl(self, spec: Spec):
        key = id(spec.wasm)
        if key not in self.ctrls:
            self.ctrls[key] = self.rt.load(spec.wasm)
        return self.ctrls[key]

    def _add(self, spec: Spec, label: str):
        req = self.rt.new_request(self._ctrl(spec), spec.arg, spec.capabilities)
        return self.engine.add(req, list(spec.prompt), label)

    def _new_round(self) -> None:
        self.rounds += 1
        self.round_tracks = [self._add(s, f"h{i}") for i, s in enumerate(self.healthy)]

    def _check_round(self) -> None:
        fam = [t for t in self.engine.tracks if t.label.startswith("h")]
        out = {t.label: (tuple(t.tokens), t.finish_reason, t.error) for t in fam}
        self.healthy_total += 1
        self.healthy_ok += out == self.reference
        if out != self.reference and len(self.mismatches) < 5:
            self.mismatches.append({label: [reason, error] for label, (_, reason, error) in out.items()
                                    if out[label] != self.reference.get(label)})

    def run(self, until_sequences: int, hostile_on: bool = True) -> None:
        while self.spawned < until_sequences:
            if hostile_on:
                n_hostile = sum(1 for t in self.engine.tracks if t.label.startswith("x") and not t.finished)
                while n_hostile < self.live and self.spawned < until_sequences:
                    kind = self.hostile[self.spawned % len(self.hostile)]
                    self.spawned += 1
                    if kind.load_only:
                        try:
                            self.rt.load(kind.spec.wasm)
                            self.unexpected_loads.append(kind.name)
                        except aicirt.LoadError:
                            self.refused_loads += 1
                        continue
                    label = f"x{self.spawned}"
                    self._add(kind.spec, label)
                    self.born[label] = self.engine.steps
                    n_hostile += 1
            else:
                self.spawned += 1           # baseline: count steps instead
            self._step()

    def drain(self) -> None:
        """Step on, spawning no hostile sequence, until every hostile one has ended."""
        while any(t.label.startswith("x") and not t.finished for t in self.engine.tracks):
            self._step()

    def _step(self) -> None:
        if not any(t.label.startswith("h") and not t.finished for t in self.engine.tracks):
            if self.round_tracks:
                self._check_round()
            self.engine.tracks = [t for t in self.engine.tracks if not t.label.startswith("h")]
            self._new_round()
        self.engine.step()
        for t in self.engine.tracks:   # a hostile sequence live this long ends, as max_tokens would end it
            if t.label.startswith("x") and not t.finished \
                    and self.engine.steps - self.born.get(t.label, self.engine.steps) >= self.max_hostile_steps:
                t.finish_reason = "abort"
                t.seq.close()
                self.aborted += 1
        self.born = {t.label: self.born[t.label] for t in self.engine.tracks
                     if t.label in self.born and not t.finished}
        # drop finished hostile tracks, and the harness's record of who wrote variables for requests
        # no longer in it: the harness itself must not grow (a set a request: ~15 MiB at 50,000)
        self.engine.tracks = [t for t in self.engine.tracks if t.label.startswith("h") or not t.finished]
        live = {id(t.seq.request) for t in self.engine.tracks}
        self.engine.var_writers = {k: v for k, v in self.engine.var_writers.items() if k in live}

    def settle(self, close_wait: float, idle: float) -> tuple[float, float]:
        """(RSS busy, RSS after the idle) in MiB, once the hostile sequences in flight have ended:
        their tracks, and the calls of those closed mid-call (aborted ones: their calls queued
        behind stuck ones run to their own limits first; up to `close_wait` s)."""
        self.drain()
        waited = time.monotonic()
        while self.rt.registry.closing_count and time.monotonic() - waited < close_wait:
            self.rt.collect()
            time.sleep(0.05)
        self.close_waits.append((round(time.monotonic() - waited, 1), self.rt.registry.closing_count))
        gc.collect()
        busy = rss_mb()[0]
        end = time.monotonic() + idle
        while time.monotonic() < end:      # idle, as a server's loop is: it frees the sequences
            self.rt.collect()              # closed mid-call (aborted) whose calls have ended
            time.sleep(0.1)
        self.rt.collect()
        gc.collect()
        return busy, rss_mb()[0]

    def close(self) -> None:
        self.engine.close()
        self.engine.tracks = []


def per_kind(rt, healthy: list[Spec], reference: dict, hostile: list[Hostile], n: int, warm: int, live: int,
             max_hostile_steps: int, close_wait: float) -> dict[str, dict]:
    """Each kind alone through `rt` beside the healthy rounds: `warm` sequences, then `n` more;
    what the `n` left behind, per sequence, once they ended and the heap was trimmed: RSS and the
    C heap in use and mapped (KiB; a leak grows `heap_in_use`, fragmentation `heap_arena` and RSS
    with free heap pages no trim returns), and Python's allocated blocks (a leak of objects). A
    load-only kind loads min(n, 4) times (each a compile in a child process)."""
    out = {}
    for kind in hostile:
        soak = Soak(rt, healthy, [kind], live, max_hostile_steps)
        soak.reference = reference
        count = min(n, 4) if kind.load_only else n
        soak.run(0 if kind.load_only else warm)
        before = _settled_reading(soak, close_wait)
        soak.run(soak.spawned + count)
        after = _settled_reading(soak, close_wait)
        out[kind.name] = {"sequences": count, **{f"{k}_per_seq": round((after[k] - before[k]) / count, 3)
                                                 for k in before},
                          "healthy_ok": soak.healthy_ok == soak.healthy_total}
        soak.close()
        print(f"  {kind.name:36s} " + " ".join(f"{k} {v:+}" for k, v in out[kind.name].items()
                                               if k.endswith("_per_seq")), file=sys.stderr)
    return out


def _settled_reading(soak: Soak, close_wait: float) -> dict[str, float]:
    soak.settle(close_wait, 0.0)
    trim_heap()
    heap = heap_stats() or {}
    return {"rss_kib": rss_mb()[0] * 1024, "heap_in_use_kib": heap.get("in_use", 0) / 1024,
            "heap_arena_kib": heap.get("arena", 0) / 1024, "py_blocks": sys.getallocatedblocks()}


def budget_child(touchers: int, budget_mib: int, calls: int) -> None:
    """One run of the memory-budget measure in this fresh process (budget_mib 0: no budget, the
    baseline); prints one JSON line."""
    from test_memory_budget import toucher

    from aicirt import StepInput

    limits = aicirt.Limits(memory_budget_bytes=budget_mib << 20, soft_deadline_s=5.0)
    with aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False) as probe:
        ctrl_bytes = toucher(probe.limits.memory_bytes >> 20)
    gc.collect()
    rss_before = rss_mb()[0]
    t0 = time.perf_counter()
    with aicirt.Runtime(aicirt.ByteTokenizer(), limits=limits, cache_dir=False) as rt:
        ctrl = rt.load(ctrl_bytes)
        budget = rt.memory_budget
        waiting, live, done, max_live, errors = touchers, [], 0, 0, []
        while waiting or live:
            while waiting and budget.room_for(1):      # as a server admits: wait for room, in order
                live.append([rt.new_request(ctrl).spawn(), 0])
                waiting -= 1
            max_live = max(max_live, len(live))
            out = rt.submit([StepInput(s, [1]) for s, _ in live]).wait()
            for entry, r in zip(live, out.results):
                entry[1] += 1
                if r.status != "ok":
                    errors.append(r.error)
            for entry in [e for e in live if e[1] >= calls]:
                entry[0].close()
                live.remove(entry)
                done += 1
        refused = budget.refused
    print(json.dumps({"budget_mib": budget_mib, "touchers": touchers, "done": done, "errors": errors[:3],
                      "n_errors": len(errors), "refused": refused, "max_live": max_live,
                      "rss_before_mb": round(rss_before, 1), "peak_rss_mb": round(rss_mb()[1], 1),
                      "seconds": round(time.perf_counter() - t0, 2)}))


def budget_measure(touchers: int, budget_mib: int, calls: int) -> dict:
    """The budget run and the no-budget baseline, each in a child process (its own peak RSS)."""
    runs = {}
    for name, mib in (("budget", budget_mib), ("no_budget", 0)):
        out = subprocess.run([sys.executable, __file__, "--budget-child", str(mib), "--budget-touchers", str(touchers),
                              "--budget-calls", str(calls)], capture_output=True, text=True, check=True)
        runs[name] = json.loads(out.stdout.strip().splitlines()[-1])
    b, n = runs["budget"], runs["no_budget"]
    result = {"budget_mib": budget_mib, "touchers": touchers, "toucher_mib": 64, "calls_each": calls,
              "budget_peak_rss_mb": b["peak_rss_mb"], "no_budget_peak_rss_mb": n["peak_rss_mb"],
              "budget_peak_over_budget_pct": round(100 * (b["peak_rss_mb"] - budget_mib) / budget_mib, 1),
              "budget_max_live": b["max_live"], "no_budget_max_live": n["max_live"],
              "budget_errors": b["n_errors"], "budget_done": b["done"], "budget_seconds": b["seconds"],
              "no_budget_seconds": n["seconds"],
              "target_met": b["peak_rss_mb"] <= budget_mib * 1.15 and b["n_errors"] == 0 and b["done"] == touchers}
    print(f"memory budget: {touchers} x 64 MiB touchers ({calls} calls each), budget {budget_mib} MiB: peak RSS "
          f"{b['peak_rss_mb']} MiB ({result['budget_peak_over_budget_pct']:+}% vs the budget), at most "
          f"{b['max_live']} live, {b['n_errors']} errors, {b['seconds']} s; without a budget: peak "
          f"{n['peak_rss_mb']} MiB, {n['max_live']} live, {n['seconds']} s", file=sys.stderr)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sequences", default="10000,50000", help="checkpoints: hostile sequences spawned")
    ap.add_argument("--warmup", type=int, default=2000)
    ap.add_argument("--live", type=int, default=24, help="hostile sequences in every batch")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--idle", type=float, default=3.0, help="seconds idle before each RSS reading")
    ap.add_argument("--call-timeout", type=float, default=0.1,
                    help="the hard limit (s of CPU) every looper runs to: SPEC's 1 s would make the loopers "
                         "alone hours of CPU at 50,000 sequences (0.05 failed a healthy call at load 20)")
    ap.add_argument("--kinds", default=None, help="only the hostile kinds whose name matches this regular expression "
                                                  "(default: the whole mix)")
    ap.add_argument("--no-js", action="store_true", help="leave the JS kinds out (no js controller build)")
    ap.add_argument("--max-hostile-steps", type=int, default=64,
                    help="a hostile sequence still live after this many steps is aborted (noop-forever)")
    ap.add_argument("--budget-touchers", type=int, default=40, help="the memory-budget measure (0: skip)")
    ap.add_argument("--budget-mib", type=int, default=1024)
    ap.add_argument("--budget-calls", type=int, default=3, help="calls each toucher makes before it ends")
    ap.add_argument("--budget-child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--budget-only", action="store_true", help="only the memory-budget measure")
    ap.add_argument("--close-wait", type=float, default=300.0,
                    help="seconds at most to wait, before each reading, for the calls of sequences closed mid-call")
    ap.add_argument("--per-kind", type=int, default=0,
                    help="first measure each kind alone: this many sequences of it, what they leave behind per "
                         "sequence (0: skip)")
    ap.add_argument("--per-kind-only", action="store_true", help="only the per-kind measure")
    ap.add_argument("--smaps", action="store_true", help="name the mappings holding the most RSS at each checkpoint")
    args = ap.parse_args()
    if args.budget_child is not None:
        budget_child(args.budget_touchers, args.budget_child, args.budget_calls)
        return
    print(f"loadavg before: {os.getloadavg()}", file=sys.stderr)
    budget = budget_measure(args.budget_touchers, args.budget_mib, args.budget_calls) if args.budget_touchers else None
    if args.budget_only:
        print(f"loadavg after: {os.getloadavg()}", file=sys.stderr)
        print(json.dumps({"bench": "hostile_soak", "memory_budget": budget}))
        return
    checkpoints = sorted(int(x) for x in args.sequences.split(","))
    scripted = toolchain.build_cached(HERE.parent / "tests" / "controllers" / "scripted.c", sdk=False)
    hostile_c = toolchain.build_cached(HERE.parent / "tests" / "hostile" / "hostile.c")
    js_wasm = None if args.no_js else toolchain.build_cached("js")
    try:
        re.compile(args.kinds or "")
    except re.error as e:
        ap.error(f"--kinds {args.kinds!r}: {e}")
    hostile, left_out = soak_kinds(hostile_c, js_wasm, args.kinds)
    if not hostile:
        ap.error(f"--kinds {args.kinds!r} selects no hostile kind")
    healthy = healthy_specs(scripted)
    limits = aicirt.Limits(call_timeout_s=args.call_timeout, first_call_timeout_s=args.call_timeout)

    malloc_policy = {"thresholds_pinned": pin_malloc_thresholds(),   # as `aicirt serve` does (memory.py)
                     "arenas_capped": cap_malloc_arenas()}
    with aicirt.Runtime(aicirt.ByteTokenizer(), limits=limits, cache_dir=False, workers=args.workers) as rt:
        reference = run_batch(rt, healthy).healthy
    kinds_alone = None
    if args.per_kind:
        print(f"each kind alone, {args.per_kind} sequences after {min(args.warmup, 16)} (KiB a sequence):",
              file=sys.stderr)
        with aicirt.Runtime(aicirt.ByteTokenizer(), limits=limits, cache_dir=False, workers=args.workers) as rt:
            kinds_alone = per_kind(rt, healthy, reference, hostile, args.per_kind, min(args.warmup, 16), args.live,
                                   args.max_hostile_steps, args.close_wait)
        if args.per_kind_only:
            print(f"loadavg after: {os.getloadavg()}", file=sys.stderr)
            print(json.dumps({"bench": "hostile_soak", "hostile_kinds": len(hostile), "left_out": left_out,
                              "per_kind": kinds_alone}))
            return
    gc.collect()
    rss_start, _ = rss_mb()

    # baseline: healthy rounds alone, as many steps as the warm-up takes sequences
    rt = aicirt.Runtime(aicirt.ByteTokenizer(), limits=limits, cache_dir=False, workers=args.workers)
    base = Soak(rt, healthy, hostile, args.live, args.max_hostile_steps)
    base.reference = reference
    t0 = time.perf_counter()
    base.run(args.warmup // 4, hostile_on=False)
    base_rss_warm = rss_mb()[0]
    base.spawned = 0
    base.run(args.warmup, hostile_on=False)
    baseline = {"steps": base.engine.steps, "seconds": round(time.perf_counter() - t0, 2),
                "rss_growth_pct": round(100 * (rss_mb()[0] - base_rss_warm) / base_rss_warm, 1),
                "healthy_ok": base.healthy_ok, "healthy_total": base.healthy_total}
    base.close()
    rt.close()

    rt = aicirt.Runtime(aicirt.ByteTokenizer(), limits=limits, cache_dir=False, workers=args.workers)
    soak = Soak(rt, healthy, hostile, args.live, args.max_hostile_steps)
    soak.reference = reference
    t0 = time.perf_counter()
    soak.run(args.warmup)
    rss_warm_busy, rss_warm = soak.settle(args.close_wait, args.idle)
    heap_warm = heap_stats() or {}
    if args.smaps:
        print(f"warm: RSS by kind of mapping (MiB): {rss_by_kind()}", file=sys.stderr)
    points = []
    for n in checkpoints:
        soak.run(n)
        busy, rss = soak.settle(args.close_wait, args.idle)
        peak = rss_mb()[1]
        heap = heap_stats() or {}
        points.append({"sequences": n, "rss_mb": round(rss, 1), "rss_busy_mb": round(busy, 1),
                       "heap_in_use_mb": round(heap.get("in_use", 0) / 2**20, 1),
                       "heap_free_mb": round(heap.get("free", 0) / 2**20, 1),
                       "py_blocks": sys.getallocatedblocks(),
                       "resident_slot_mb": round(soak.rt.registry.resident.held_bytes / 2**20, 1),
                       "growth_pct": round(100 * (rss - rss_warm) / rss_warm, 1),
                       "seconds": round(time.perf_counter() - t0, 1), "healthy_ok": soak.healthy_ok,
                       "healthy_total": soak.healthy_total})
        print(f"{n:>7} sequences: RSS {rss:7.1f} MiB after {args.idle} s idle ({busy:.1f} before), "
              f"{points[-1]['growth_pct']:+.1f}% since warm-up, "
              f"peak {peak:.1f}, healthy {soak.healthy_ok}/{soak.healthy_total}, {points[-1]['seconds']} s",
              file=sys.stderr)
        if args.smaps:
            points[-1]["rss_by_kind_mb"] = rss_by_kind()
            print(f"  RSS by kind of mapping (MiB): {points[-1]['rss_by_kind_mb']}", file=sys.stderr)
            print("  " + "\n  ".join(top_mappings()), file=sys.stderr)
    elapsed = time.perf_counter() - t0
    steps, soak_mismatches = soak.engine.steps, soak.mismatches
    refused_loads, aborted, unexpected_loads = soak.refused_loads, soak.aborted, soak.unexpected_loads
    close_waits = soak.close_waits
    soak.close()
    rt.close()
    del soak, rt
    gc.collect()
    rss_after, peak = rss_mb()
    print(json.dumps({
        "sequences": checkpoints[-1], "hostile_kinds": len(hostile), "live_hostile_per_batch": args.live,
        "refused_loads": refused_loads, "unexpected_loads": unexpected_loads, "aborted_after_steps": aborted,
        "max_hostile_steps": args.max_hostile_steps, "memory_budget": budget,
        "close_waits_s_and_left": close_waits,
        "loadavg_after": os.getloadavg(),
        "workers": args.workers, "malloc": malloc_policy, "steps": steps, "seconds": round(elapsed, 1),
        "left_out": left_out, "idle_s": args.idle, "call_timeout_s": args.call_timeout,
        "rss_start_mb": round(rss_start, 1), "rss_warm_mb": round(rss_warm, 1),
        "rss_warm_busy_mb": round(rss_warm_busy, 1), "heap_warm_in_use_mb": round(heap_warm.get("in_use", 0) / 2**20, 1),
        "heap_warm_free_mb": round(heap_warm.get("free", 0) / 2**20, 1), "rss_peak_mb": round(peak, 1),
        "rss_after_close_mb": round(rss_after, 1), "rss_growth_pct": points[-1]["growth_pct"],
        "checkpoints": points, "healthy_ok": points[-1]["healthy_ok"], "healthy_total": points[-1]["healthy_total"],
        "healthy_mismatches": soak_mismatches, "baseline_healthy_only": baseline, "per_kind": kinds_alone,
    }))


if __name__ == "__main__":
    main()
