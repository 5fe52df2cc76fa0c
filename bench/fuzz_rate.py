"""How fast the fuzzer drives the shipped controllers, and how long the hostile suite takes.

Fuzzer: `aicirt.testing.Fuzzer` steps/s per shipped controller (random capability grants, as
`aicirt fuzz` runs it), against the baseline in the same run: a bare loop over the same public API
(submit, wait, take the lowest allowed token, apply the splice; no checks, no randomness), so
the ratio is what the fuzzer's engine and checks cost per step.
Hostile suite: every kind of tests/hostile/kinds.py, on the current hot path, beside healthy
sequences (the pytest suite's own check); a case "survives" when the process lives on and
every healthy output equals its output alone. Baseline: the healthy batch alone.

    python bench/fuzz_rate.py [--steps 3000] [--no-hostile]

Last line: one JSON object (steps_per_s, hostile_cases, hostile_survived, ...).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import aicirt  # noqa: E402
from aicirt.build import toolchain  # noqa: E402
from aicirt.testing import Fuzzer  # noqa: E402
from aicirt.core.results import splice_for  # noqa: E402

SHIPPED = {"regex": "[0-9]{1,4}-[a-z]{2,6}", "yesno": "", "choice": "red\ngreen\nblue", "splice": "", "countdown": "",
           "json": '{"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}}, '
                   '"required": ["n", "ok"]}'}


def fuzz_rates(steps: int) -> dict:
    out = {}
    for name, arg in SHIPPED.items():
        wasm = toolchain.build_cached(name)
        with Fuzzer(wasm, arg) as fz:   # random grants
            report = fz.fuzz(steps=steps, seed=0)
        bare = bare_rate(wasm, arg, steps)
        out[name] = {"steps": report.steps, "steps_per_s": round(report.steps_per_s), "runs": report.runs,
                     "ok": report.ok, "failure": str(report.failures[0]).splitlines()[0] if report.failures else None,
                     "baseline_bare_loop_steps_per_s": round(bare)}
        print(f"{name:10s} fuzzer {out[name]['steps_per_s']:6d} steps/s ({report.runs} runs, ok={report.ok}); "
              f"bare loop {bare:6.0f} steps/s", file=sys.stderr)
    return out


def bare_rate(wasm, arg: str, steps: int) -> float:
    """Steps/s of the simplest legal engine loop on the public API, one sequence at a time."""
    import numpy as np
    with aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False) as rt:
        ctrl = rt.load(wasm)
        done, seq, tokens, sampled = 0, None, [], None
        t0 = time.perf_counter()
        while done < steps:
            if seq is None:
                seq, tokens, sampled = rt.new_request(ctrl, arg).spawn(), [1, 2], None
            out = rt.submit([aicirt.StepInput(seq, tokens, sampled)]).wait()
            done += 1
            r = out.results[0]
            if r.status != "ok" or not r.branches or len(tokens) > 34:
                seq.close()
                seq = None
                continue
            b = r.branches[0]
            sampled = None
            if b.mask_row is not None:
                sampled = int(np.flatnonzero(np.unpackbits(out.masks[b.mask_row].view(np.uint8), bitorder="little"))[0])
                tokens = tokens + [sampled]
            sp = splice_for(b.splices, sampled)
            if sp is not None:
                tokens = tokens[:len(tokens) - sp.backtrack] + list(sp.ff_tokens)
        return done / (time.perf_counter() - t0)


def hostile_suite() -> dict:
    from hostile.kinds import HERE as KINDS_DIR
    from hostile.kinds import KINDS
    from hostile.runner import Spec, healthy_specs, run_batch

    scripted = toolchain.build_cached(HERE.parent / "tests" / "controllers" / "scripted.c", sdk=False)
    hostile_c = toolchain.build_cached(KINDS_DIR / "hostile.c")
    healthy = healthy_specs(scripted)
    with aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False) as rt:
        t0 = time.perf_counter()
        alone = run_batch(rt, healthy).healthy
        baseline_s = time.perf_counter() - t0
    survived, slow, failed = 0, [], []
    t0 = time.perf_counter()
    for kind in KINDS:
        limits = aicirt.Limits(**{"call_timeout_s": 0.25, "first_call_timeout_s": 0.25, **kind.limits})
        with aicirt.Runtime(aicirt.ByteTokenizer(), limits=limits, cache_dir=False) as rt:
            k0 = time.perf_counter()
            spec = Spec(kind.wasm if kind.wasm is not None else hostile_c, kind.arg, capabilities=kind.capabilities)
            try:
                rt.load(spec.wasm)
                out = run_batch(rt, healthy, spec, copies=kind.copies, respawn=kind.respawn)
            except aicirt.LoadError:
                out = run_batch(rt, healthy)
            took = time.perf_counter() - k0
        ok = out.healthy == alone
        survived += ok
        if not ok:
            failed.append(kind.name)
        if kind.within_s is not None and took > kind.within_s:
            slow.append(kind.name)
    total = time.perf_counter() - t0
    print(f"hostile suite: {survived}/{len(KINDS)} kinds left the healthy outputs intact in {total:.1f} s "
          f"(healthy alone: {baseline_s * 1e3:.0f} ms); harmed: {failed}; too slow: {slow}", file=sys.stderr)
    return {"hostile_cases": len(KINDS), "hostile_survived": survived, "hostile_harmed": failed,
            "hostile_too_slow": slow, "hostile_suite_s": round(total, 1), "healthy_alone_ms": round(baseline_s * 1e3, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3000, help="fuzzer steps per shipped controller")
    ap.add_argument("--no-hostile", action="store_true")
    args = ap.parse_args()
    rates = fuzz_rates(args.steps)
    total_steps = sum(r["steps"] for r in rates.values())
    total_s = sum(r["steps"] / r["steps_per_s"] for r in rates.values() if r["steps_per_s"])
    bare_s = sum(r["steps"] / r["baseline_bare_loop_steps_per_s"] for r in rates.values()
                 if r["baseline_bare_loop_steps_per_s"])
    result = {"steps_per_s": round(total_steps / total_s) if total_s else 0,
              # the same steps in a bare submit/wait loop, and the fuzzer's rate over it (same run)
              "bare_loop_steps_per_s": round(total_steps / bare_s) if bare_s else 0,
              "fuzzer_vs_bare": round(bare_s / total_s, 3) if total_s and bare_s else None,
              "per_controller": rates}
    result.update(hostile_suite() if not args.no_hostile else {"hostile_cases": 0, "hostile_survived": 0})
    result["hot_path"] = aicirt.native.get_native().mode
    print(json.dumps(result))


if __name__ == "__main__":
    main()
