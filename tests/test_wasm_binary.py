"""The module rewriter (exports mutable globals for fork) and a fuzz of everything that parses Wasm."""
from __future__ import annotations

import wasmtime
from _budget import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aicirt
from aicirt import LoadError
from aicirt.loader.wasm_binary import WasmFormatError, export_mutable_globals, globals_and_exports

MODULE = wasmtime.wat2wasm("""(module
  (import "m" "g" (global $imp (mut i32)))
  (global $a (mut i64) (i64.const 7))
  (global $b i32 (i32.const 1))
  (global $c (mut f32) (f32.const 1.5))
  (global $d (export "already") (mut i32) (i32.add (i32.const 1) (i32.const 2)))
  (memory (export "memory") 1)
  (func (export "f") (result i64) (global.get $a)))""")


def test_exports_unexported_mutable_globals_only():
    out, names = export_mutable_globals(MODULE)
    assert names == {0: "aicirt-global-0", 1: "aicirt-global-1", 3: "aicirt-global-3", 4: "already"}
    _, exports = globals_and_exports(out)
    assert {n for n, (kind, _) in exports.items() if kind == 3} == {"aicirt-global-0", "aicirt-global-1", "aicirt-global-3", "already"}
    wasmtime.Module(wasmtime.Engine(), out)   # still valid


def test_adds_an_export_section_when_there_is_none():
    src = wasmtime.wat2wasm('(module (global (mut i32) (i32.const 0)) (func))')
    out, names = export_mutable_globals(src)
    assert names == {0: "aicirt-global-0"}
    module = wasmtime.Module(wasmtime.Engine(), out)
    assert [e.name for e in module.exports] == ["aicirt-global-0"]


def test_no_mutable_globals_leaves_module_untouched():
    src = wasmtime.wat2wasm('(module (global i32 (i32.const 0)))')
    assert export_mutable_globals(src) == (src, {})


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzz_rewriter_on_mutated_modules(data):
    """Flip, drop or insert bytes: the rewriter returns a module or raises WasmFormatError, nothing else."""
    raw = bytearray(MODULE)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(8, len(raw) - 1))
        op = data.draw(st.sampled_from(["flip", "drop", "insert"]))
        if op == "flip":
            raw[i] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "drop":
            del raw[i]
        else:
            raw.insert(i, data.draw(st.integers(0, 255)))
    try:
        export_mutable_globals(bytes(raw))
    except WasmFormatError:
        pass


_rt = None


def _runtime():
    global _rt
    if _rt is None:
        _rt = aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False)
    return _rt


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=64) | st.binary(max_size=200).map(lambda b: b"\0asm\x01\0\0\0" + b))
def test_fuzz_loader_raises_only_load_error(blob):
    try:
        _runtime().load(blob)
    except LoadError:
        pass
