"""Soak: tens of thousands of mixed hostile sequences through one Runtime beside healthy ones.

Hostile sequences come from the whole hostile suite (tests/hostile/kinds.py): the loopers and
spinners (each runs to the hard time limit), the floods (variables, log, host calls), the memory
touchers (48 MiB every call, malloc until the limit), traps, bad pointers, invalid masks, refused
capabilities, forks past the limit, legal oddities. `--live` of them are in every batch, each
replaced when it ends. Left out, and named in the output (`left_out`) with the reason: kinds
that are not sequences (refused at load or spawn), kinds marked xfail, and `noop-forever` (it never
ends, so it would fill every slot). A kind's own limits, copies and respawns are the suite's
harness settings, not the soak's: here every kind runs once per round, under the soak's limits.

Beside them two healthy requests run round after round; every round's output is compared with
the output the same requests give alone. RSS is read after warm-up and at each checkpoint, each
time after the hostile sequences in flight have finished and the runtime has idled `--idle`
seconds (so the figure is what the runtime keeps, not what live sequences use: a live memory
toucher alone holds 48 MiB); `rss_busy_mb` is the same before the idle. The baseline in the same
run: healthy rounds alone, for as many steps as warm-up.

    python bench/hostile_soak.py                       # checkpoints at 10,000 and 50,000 sequences
    python bench/hostile_soak.py --sequences 2000 --warmup 500
    python bench/hostile_soak.py --kinds 'flood|memory' --sequences 3000 --warmup 500   # one family: a fast reproducer

Last line: one JSON object (sequences, rss_growth_pct, healthy_ok, healthy_total, left_out, ...).
Target (issue 10, and the memory issue): rss_growth_pct <= 10 after a few seconds of idle and
every healthy output correct.
"""
from __future__ import annotations

import argparse
import gc
import json
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from hostile.kinds import KINDS  # noqa: E402
from hostile.runner import Spec, healthy_specs, run_batch  # noqa: E402

import aicirt  # noqa: E402
from aicirt import toolchain  # noqa: E402
from aicirt.memory import cap_malloc_arenas, pin_malloc_thresholds  # noqa: E402
from aicirt.testing import Choices, EngineSettings, FuzzEngine  # noqa: E402


def rss_mb() -> tuple[float, float]:
    """(current, peak) resident set size in MiB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def soak_kinds(only: str | None = None) -> tuple[list, dict[str, str]]:
    """(the kinds in the mix, {kind left out: why}); `only`: a regular expression the names of the
    kinds kept must contain a match of (the others are left out as "not selected")."""
    kinds, left_out = [], {}
    for k in KINDS:
        if only is not None and not re.search(only, k.name):
            left_out[k.name] = "not selected (--kinds)"
        elif k.expect.startswith(("load:", "spawn:")):
            left_out[k.name] = "not a sequence: refused at " + k.expect.split(":")[0]
        elif k.xfail:
            left_out[k.name] = "xfail: " + k.xfail
        elif k.name == "noop-forever":
            left_out[k.name] = "never ends: it would fill every slot"
        else:
            kinds.append(k)
    return kinds, left_out


class Soak:
    def __init__(self, rt, healthy: list[Spec], hostile: list[Spec], live: int):
        self.rt, self.healthy, self.hostile, self.live = rt, healthy, hostile, live
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
                while n_hostile < self.live:
                    spec = self.hostile[self.spawned % len(self.hostile)]
                    self._add(spec, f"x{self.spawned}")
                    self.spawned += 1
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
        # drop finished hostile tracks, and the harness's record of who wrote variables for requests
        # no longer in it: the harness itself must not grow (a set a request: ~15 MiB at 50,000)
        self.engine.tracks = [t for t in self.engine.tracks if t.label.startswith("h") or not t.finished]
        live = {id(t.seq.request) for t in self.engine.tracks}
        self.engine.var_writers = {k: v for k, v in self.engine.var_writers.items() if k in live}

    def close(self) -> None:
        self.engine.close()
        self.engine.tracks = []


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
    args = ap.parse_args()
    checkpoints = sorted(int(x) for x in args.sequences.split(","))
    scripted = toolchain.build_cached(HERE.parent / "tests" / "controllers" / "scripted.c", sdk=False)
    hostile_c = toolchain.build_cached(HERE.parent / "tests" / "hostile" / "hostile.c")
    try:
        re.compile(args.kinds or "")
    except re.error as e:
        ap.error(f"--kinds {args.kinds!r}: {e}")
    kinds, left_out = soak_kinds(args.kinds)
    if not kinds:
        ap.error(f"--kinds {args.kinds!r} selects no hostile kind")
    hostile = [Spec(k.wasm if k.wasm is not None else hostile_c, k.arg, capabilities=k.capabilities) for k in kinds]
    healthy = healthy_specs(scripted)
    limits = aicirt.Limits(call_timeout_s=args.call_timeout, first_call_timeout_s=args.call_timeout)

    def settled(soak: Soak) -> tuple[float, float]:
        """(RSS busy, RSS after the idle) in MiB, once the hostile sequences in flight have ended."""
        soak.drain()
        gc.collect()
        busy = rss_mb()[0]
        time.sleep(args.idle)
        gc.collect()
        return busy, rss_mb()[0]

    malloc_policy = {"thresholds_pinned": pin_malloc_thresholds(),   # as `aicirt serve` does (memory.py)
                     "arenas_capped": cap_malloc_arenas()}
    with aicirt.Runtime(aicirt.ByteTokenizer(), limits=limits, cache_dir=False, workers=args.workers) as rt:
        reference = run_batch(rt, healthy).healthy
    gc.collect()
    rss_start, _ = rss_mb()

    # baseline: healthy rounds alone, as many steps as the warm-up takes sequences
    rt = aicirt.Runtime(aicirt.ByteTokenizer(), limits=limits, cache_dir=False, workers=args.workers)
    base = Soak(rt, healthy, hostile, args.live)
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
    soak = Soak(rt, healthy, hostile, args.live)
    soak.reference = reference
    t0 = time.perf_counter()
    soak.run(args.warmup)
    rss_warm_busy, rss_warm = settled(soak)
    points = []
    for n in checkpoints:
        soak.run(n)
        busy, rss = settled(soak)
        peak = rss_mb()[1]
        points.append({"sequences": n, "rss_mb": round(rss, 1), "rss_busy_mb": round(busy, 1),
                       "resident_slot_mb": round(soak.rt.registry.resident.held_bytes / 2**20, 1),
                       "growth_pct": round(100 * (rss - rss_warm) / rss_warm, 1),
                       "seconds": round(time.perf_counter() - t0, 1), "healthy_ok": soak.healthy_ok,
                       "healthy_total": soak.healthy_total})
        print(f"{n:>7} sequences: RSS {rss:7.1f} MiB after {args.idle} s idle ({busy:.1f} before), "
              f"{points[-1]['growth_pct']:+.1f}% since warm-up, "
              f"peak {peak:.1f}, healthy {soak.healthy_ok}/{soak.healthy_total}, {points[-1]['seconds']} s",
              file=sys.stderr)
    elapsed = time.perf_counter() - t0
    steps, soak_mismatches = soak.engine.steps, soak.mismatches
    soak.close()
    rt.close()
    del soak, rt
    gc.collect()
    rss_after, peak = rss_mb()
    print(json.dumps({
        "sequences": checkpoints[-1], "hostile_kinds": len(kinds), "live_hostile_per_batch": args.live,
        "workers": args.workers, "malloc": malloc_policy, "steps": steps, "seconds": round(elapsed, 1),
        "left_out": left_out, "idle_s": args.idle, "call_timeout_s": args.call_timeout,
        "rss_start_mb": round(rss_start, 1), "rss_warm_mb": round(rss_warm, 1),
        "rss_warm_busy_mb": round(rss_warm_busy, 1), "rss_peak_mb": round(peak, 1),
        "rss_after_close_mb": round(rss_after, 1), "rss_growth_pct": points[-1]["growth_pct"],
        "checkpoints": points, "healthy_ok": points[-1]["healthy_ok"], "healthy_total": points[-1]["healthy_total"],
        "healthy_mismatches": soak_mismatches, "baseline_healthy_only": baseline,
    }))


if __name__ == "__main__":
    main()
