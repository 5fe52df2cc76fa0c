"""Host-import cost: the runtime's path vs a wasmtime-py `Func` callback, per import, one run.

Per call: a controller (bench/controllers/host_calls.c) calls one import N times inside each
`mid-process`; the call's own time (measured in the worker) minus that of a call making none,
divided by N.

Two ways to answer an import, each in its own Runtime, everything else equal:
  native    the runtime's own: native callbacks (native/host.c) answer the imports in
            abi.NATIVE_IMPORTS in C; the others (tokenize, detokenize) go from a native trampoline
            to their Python handler (host_imports.py)
  callback  the imports in CALLBACK are redefined as wasmtime-py `Linker.define_func` callbacks
            (ctypes trampolines, wasmtime-py's argument conversion, the GIL): vocab-size and
            eos-token answer the runtime's values from Python, tokenize and detokenize run the
            very Python handler the native path calls. The other imports have no Python
            implementation any more: they are timed on the native path only.
Per sequence-step (native only): a batch of 64 controllers that each call `vocab-size`,
`var-get` and `log` every step; the sequence-step as bench/step_overhead.py measures it, and the
submit -> wait wall time per sequence beside it.

    python bench/host_calls.py [--steps 200] [--batch 64] [--calls 200]

The last line is one JSON object: `native_per_call_us`, `callback_per_call_us`, `per_call_speedup`
(callback / native, per import in CALLBACK), `host_step_us`, `no_import_step_us`.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import time
from pathlib import Path

import numpy as np
import wasmtime
from wasmtime import _ffi as wt_ffi

import aicirt
from aicirt import StepInput, abi
from aicirt.native.guest import Guest, GuestFault
from aicirt.build.toolchain import build_cached

HERE = Path(__file__).resolve().parent
VOCAB = 151_936
PER_CALL = ("vocab-size", "eos-token", "self-seq-id", "capabilities", "arg", "var-get", "var-set",
            "var-append", "log", "tokenize", "detokenize")


class Vocab:
    vocab_size = VOCAB
    eos_token_id = 0
    token_bytes = [bytes([i % 256]) for i in range(VOCAB)]

    def encode(self, text):
        return [ord(c) for c in text]

    def decode_bytes(self, ids):
        return bytes(i % 256 for i in ids)


CALLBACK = ("vocab-size", "eos-token", "tokenize", "detokenize")


def use_wasmtime_py_callbacks(rt: aicirt.Runtime, ctrl: aicirt.Controller) -> None:
    """Redefine the imports in CALLBACK of `ctrl`'s InstancePre as wasmtime-py callbacks."""
    linker = wasmtime.Linker(rt.engine)
    from aicirt.native.linker import define_imports
    define_imports(rt.native, linker, rt._host, ctrl.wasi_imports)
    linker.allow_shadowing = True
    i32 = wasmtime.ValType.i32()
    native = rt.native
    consts = {"vocab-size": rt.vocab_size, "eos-token": rt.eos_token}
    for name in CALLBACK:
        params, results = abi.HOST_IMPORTS[name]
        ty = wasmtime.FuncType([i32] * len(params), [i32] * len(results))
        if name in consts:
            linker.define_func(abi.HOST_MODULE, name, ty, lambda _v=consts[name]: _v)
            continue
        impl = getattr(rt._host, "h_" + name.replace("-", "_"))

        def cb(caller, *args, _impl=impl, _name=name):
            ctx = ctypes.cast(caller._context(), ctypes.c_void_p).value
            seq = rt.registry.lookup(wt_ffi.wasmtime_context_get_data(caller._context()))
            g = Guest(native, seq.slot, native.ffi.cast("void *", ctx), _name, rt.limits.host_arg_bytes)
            try:
                return _impl(seq, g, *(a & 0xFFFFFFFF for a in args))
            except GuestFault as e:
                raise wasmtime.WasmtimeError(str(e)) from None
        linker.define_func(abi.HOST_MODULE, name, ty, cb, access_caller=True)
    key = (ctrl.sha256, ctrl.snapshot)   # the key Runtime.instance_pre uses
    rt._plans.pop(key, None)
    rt._pres[key] = linker.instantiate_pre(ctrl.module)


def run_steps(rt, ctrl, arg: str, batch: int, steps: int) -> tuple[list[float], list[float]]:
    """(per-sequence wall µs per step, per-call elapsed µs inside the worker)."""
    reqs = [rt.new_request(ctrl, arg=arg) for _ in range(batch)]
    seqs = [r.spawn() for r in reqs]
    tokens = [[1, 2, 3] for _ in seqs]
    wall, inside = [], []
    for k in range(steps + 10):
        for t in tokens:
            t.append(k % 200)
        t0 = time.perf_counter()
        out = rt.submit([StepInput(s, t, t[-1]) for s, t in zip(seqs, tokens)]).wait(5.0)
        dt = (time.perf_counter() - t0) * 1e6
        assert all(r.status == "ok" for r in out.results), out.results[0].error
        for r in reqs:
            r.take_var_changes()
        if k >= 10:
            wall.append(dt / batch)
            inside += [r.elapsed_us for r in out.results]
    for r in reqs:
        r.close()
    return wall, inside


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--calls", type=int, default=200, help="calls of one import per mid-process (per-call part)")
    a = ap.parse_args()
    wasm = build_cached(HERE / "controllers" / "host_calls.c", sdk=False)
    report: dict = {"vocab": VOCAB, "batch": a.batch, "calls": a.calls}
    med = lambda xs: float(np.median(xs))  # noqa: E731
    for path in ("native", "callback"):
        with aicirt.Runtime(Vocab(), cache_dir=False, workers=2, prebuild_trie=False,
                            limits=aicirt.Limits(soft_deadline_s=5.0)) as rt:
            ctrl = rt.load(wasm)
            if path == "callback":
                use_wasmtime_py_callbacks(rt, ctrl)
            assert rt.native.mode == "compiled", "the C hot path is needed for this benchmark"
            _, none = run_steps(rt, ctrl, "none 0", 4, a.steps // 4)
            per_call, spread = {}, {}
            for name in PER_CALL if path == "native" else CALLBACK:
                _, inside = run_steps(rt, ctrl, f"{name} {a.calls}", 4, a.steps // 10)
                per_call[name] = max(0.0, (med(inside) - med(none)) / a.calls)
                q = np.percentile(inside, [10, 90])
                spread[name] = [round(max(0.0, (float(x) - med(none)) / a.calls), 3) for x in q]
            report[f"{path}_per_call_us"] = {k: round(v, 3) for k, v in per_call.items()}
            report[f"{path}_per_call_p10_p90_us"] = spread
            if path == "native":
                # as in step_overhead.py: the sequence-step measured in the hot path (realloc, call
                # with its three imports, mask copy, post-return); the wall adds Python submit + wait
                wall, inside = run_steps(rt, ctrl, "step 0", a.batch, a.steps)
                base_wall, base = run_steps(rt, ctrl, "none 0", a.batch, a.steps)
                report["host_step_us"], report["no_import_step_us"] = med(inside), med(base)
                report["step_wall_us"], report["no_import_step_wall_us"] = med(wall), med(base_wall)
    report["per_call_speedup"] = {k: round(v / max(report["native_per_call_us"][k], 1e-3), 1)
                                  for k, v in report["callback_per_call_us"].items()}
    for k, v in report.items():
        print(f"{k:>26}: {v}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
