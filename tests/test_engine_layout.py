"""Where a slot's linear memory sits (native/engine_config.py MemoryLayout): a Runtime's engine
reserves 4 GiB a slot where the process's address-space budget allows, and its compiled code then
checks no bounds; past the budget it reserves the memory limit and checks every access. Memory
faults end only the faulting sequence, with the same message, either way."""
from __future__ import annotations

import gc

import pytest
from hostile.kinds import KINDS, Kind
from hostile.runner import Spec, healthy_specs, run_batch
from hostile.wat import module
from test_hostile import _check_hostile, alone, hostile_c_wasm  # noqa: F401 (fixtures shared)

import aicirt
from aicirt.build import toolchain
from aicirt.native import engine_config
from aicirt.native.engine_config import UNCHECKED, engine_layout

_FAULTS = [k for k in KINDS if k.name in ("out-of-bounds-load", "result-pointer-out-of-bounds", "mask-pointer-out-of-bounds",
                                          "realloc-out-of-bounds", "grow-past-memory-limit")] + [
    # past the memory's end (2 pages), a constant offset past the 4 GiB reservation and its guard, a store near 4 GiB
    Kind("load-past-memory-end", "", "error: out of bounds", module("(drop (i32.load (i32.const 131072)))")),
    Kind("load-offset-past-the-guard", "", "error: out of bounds",
         module("(drop (i32.load offset=4294967040 (i32.const 4096)))")),
    Kind("store-near-4-gib", "", "error: out of bounds", module("(i32.store (i32.const -16) (i32.const 7))")),
]


def _runtime(monkeypatch, checked: bool, **limits) -> aicirt.Runtime:
    """A Runtime whose engine has the layout asked for (the budget set to force it)."""
    monkeypatch.setattr(engine_config, "UNCHECKED_BUDGET", 0 if checked else 1 << 62)
    return aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False,
                          limits=aicirt.Limits(soft_deadline_s=5.0, **limits))


@pytest.mark.parametrize("checked", [False, True], ids=["unchecked", "checked"])
@pytest.mark.parametrize("kind", _FAULTS, ids=lambda k: k.name)
def test_memory_faults_end_only_that_sequence_in_both_layouts(monkeypatch, scripted_wasm, hostile_c_wasm, alone,
                                                              kind, checked):
    with _runtime(monkeypatch, checked, **kind.limits) as rt:   # the default time limits: faults are at once
        assert engine_layout(rt.engine).checked is checked
        spec = Spec(kind.wasm if kind.wasm is not None else hostile_c_wasm, kind.arg, capabilities=kind.capabilities)
        out = run_batch(rt, healthy_specs(scripted_wasm), spec, settle=True)
    assert out.healthy == alone
    _check_hostile(kind, out.hostile)


def test_the_layouts_compile_apart(monkeypatch):
    """The compile cache key names the layout: code compiled for one never loads into the other."""
    with _runtime(monkeypatch, False) as unchecked, _runtime(monkeypatch, True) as checked:
        assert engine_layout(unchecked.engine) == UNCHECKED
        assert engine_layout(checked.engine).reservation == checked.limits.memory_bytes
        assert unchecked.engine_key != checked.engine_key
        wasm = toolchain.build_cached("regex")
        for rt in (unchecked, checked):   # each compiles its own (the artifact cache is keyed by engine_key)
            seq = rt.new_request(rt.load(wasm), b"[0-9]+").spawn()
            out = rt.submit([aicirt.StepInput(seq, [1])]).wait(30.0)
            assert out.results[0].status == "ok"
            seq.close()


def test_a_closed_runtime_gives_its_address_space_back(monkeypatch):
    """The budget counts live engines only: a Runtime freed makes room for the next."""
    gc.collect()   # earlier tests' runtimes, closed but not yet freed
    before = engine_config._reserved
    want = 64 * (UNCHECKED.reservation + UNCHECKED.guard)
    monkeypatch.setattr(engine_config, "UNCHECKED_BUDGET", before + want)
    rt = aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False, max_sequences=64)
    assert not engine_layout(rt.engine).checked and engine_config._reserved == before + want
    with aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False, max_sequences=64) as second:
        assert engine_layout(second.engine).checked   # no room beside the first
    rt.close()
    del rt, second
    gc.collect()
    assert engine_config._reserved == before
    with aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False, max_sequences=64) as third:
        assert not engine_layout(third.engine).checked
