"""Loading: validation names what is wrong, the disk cache, the fork rewrite, the WASI shim."""
from __future__ import annotations

import struct

import pytest
import wasmtime
from conftest import mask_tokens

import aicirt
from aicirt import StepInput
from aicirt import LoadError

OK_EXPORTS = """
  (memory (export "memory") 1)
  (global $bump (mut i32) (i32.const 1024))
  (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $bump))
    (global.set $bump (i32.add (global.get $bump) (local.get 3)))
    (local.get $p))
"""
# One branch, mask at 64 allowing token 1 (9 words for the byte tokenizer), no splices.
MID_PROCESS = """
  (data (i32.const 16) "\\40\\00\\00\\00\\01\\00\\00\\00")           ;; result: branches ptr 64, len 1
  (data (i32.const 64) "\\01\\00\\00\\00\\80\\00\\00\\00\\09\\00\\00\\00")  ;; mask some, ptr 128, len 9
  (data (i32.const 128) "\\02")                                     ;; token 1
  (func (export "mid-process") (param i32 i32 i32 i32 i32 i32 i32) (result i32) (i32.const 16))
"""


def wat(body: str) -> bytes:
    return wasmtime.wat2wasm(f"(module {body})")


@pytest.mark.parametrize("body, needle", [
    (OK_EXPORTS.replace('(memory (export "memory") 1)', "(memory 1)") + MID_PROCESS, "missing export `memory`"),
    (OK_EXPORTS, "missing export `mid-process` (i32, i32, i32, i32, i32, i32, i32) -> (i32)"),
    (OK_EXPORTS + '(func (export "mid-process") (param i32) (result i32) (i32.const 0))',
     "export `mid-process` has type (i32) -> (i32)"),
    ('(import "env" "foo" (func))' + OK_EXPORTS + MID_PROCESS, "import `env`.`foo` is not provided"),
    ('(import "aici:controller/host@0.1.0" "nope" (func))' + OK_EXPORTS + MID_PROCESS, "not in WIT interface `host`"),
    ('(import "aici:controller/host@0.1.0" "log" (func (param i32)))' + OK_EXPORTS + MID_PROCESS,
     "import `aici:controller/host@0.1.0`.`log` has type (i32) -> (), expected (i32, i32) -> ()"),
])
def test_not_a_controller_is_named(rt, body, needle):
    with pytest.raises(LoadError) as e:
        rt.load(wat(body))
    assert needle in str(e.value)


def test_garbage_and_components_rejected(rt, tmp_path):
    with pytest.raises(LoadError, match="not a core Wasm module"):
        rt.load(b"\0asm\x0d\0\x01\0")        # a component's preamble
    with pytest.raises(LoadError, match="not a core Wasm module"):
        rt.load(b"hello")
    with pytest.raises(LoadError, match="no such file"):
        rt.load(tmp_path / "missing.wasm")
    with pytest.raises(LoadError, match="runs past the end"):
        rt.load(wat(OK_EXPORTS + MID_PROCESS)[:-3])


def test_upload_limit(make_rt):
    runtime = make_rt(upload_bytes=100)
    with pytest.raises(LoadError, match="over the upload limit of 100"):
        runtime.load(wat(OK_EXPORTS + MID_PROCESS))


def test_wat_controller_runs_and_unexported_globals_are_exported_for_fork(rt):
    ctrl = rt.load(wat(OK_EXPORTS + MID_PROCESS))
    assert ctrl.globals == {0: "aicirt-global-0"}
    seq = rt.new_request(ctrl).spawn()
    out = rt.submit([StepInput(seq, [5, 6], None)]).wait()
    assert mask_tokens(out, out.results[0].branches[0].mask_row) == [1]


def test_fork_copies_memory_and_globals(rt, scripted_wasm):
    ctrl = rt.load(scripted_wasm)
    assert any(name.startswith("aicirt-global-") for name in ctrl.globals.values())  # __stack_pointer
    parent = rt.new_request(ctrl).spawn()
    parent.memory.write(parent.store, b"state!", 70000)
    child, = parent._fork(1)
    assert child.memory.read(child.store, 70000, 70006) == b"state!"
    for idx, g in parent._globals.items():
        assert child._globals[idx].value(child.store) == g.value(parent.store)


def test_compiled_module_cached_on_disk(hot_path, tmp_path, scripted_wasm):
    with aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=tmp_path) as runtime:
        runtime.load(scripted_wasm)
        cached = list((tmp_path / "modules").glob("*.cwasm"))
        assert len(cached) == 1
        cached[0].write_bytes(b"corrupt")                 # a bad entry is recompiled, not fatal
        runtime.load(scripted_wasm)
        assert cached[0].read_bytes() != b"corrupt"


WASI_IMPORTS = """
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_open" (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "random_get" (func $random_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "clock_time_get" (func $clock (param i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
"""
WASI = """
  (data (i32.const 300) "hello from stdout\\n")
  (data (i32.const 400) "\\2c\\01\\00\\00\\12\\00\\00\\00")          ;; iovec {300, 18}
  (func (export "mid-process") (param i32 i32 i32 i32 i32 i32 i32) (result i32)
    (drop (call $fd_write (i32.const 1) (i32.const 400) (i32.const 1) (i32.const 500)))
    (i32.store (i32.const 504) (call $path_open (i32.const 3) (i32.const 0) (i32.const 0) (i32.const 0)
                                                (i32.const 0) (i64.const 0) (i64.const 0) (i32.const 0) (i32.const 0)))
    (i32.store (i32.const 508) (call $random_get (i32.const 600) (i32.const 8)))
    (i32.store (i32.const 512) (call $clock (i32.const 0) (i64.const 0) (i32.const 520)))
    (if (i32.eq (local.get 2) (i32.const 3)) (then (call $exit (i32.const 7))))
    (i32.const 16))
"""


def test_wasi_shim_no_real_io(rt):
    ctrl = rt.load(wat(WASI_IMPORTS + OK_EXPORTS + WASI + MID_PROCESS.split("(func")[0]))
    seq = rt.new_request(ctrl).spawn()
    r = rt.submit([StepInput(seq, [1], None)]).wait().results[0]
    assert r.status == "ok" and r.logs == "hello from stdout\n"
    nwritten, path_open, random_get, clock = struct.unpack("<IIII", seq.memory.read(seq.store, 500, 516))
    assert (nwritten, path_open, random_get, clock) == (18, 52, 52, 0)   # ENOSYS for files and randomness
    assert seq.memory.read(seq.store, 520, 528) == b"\0" * 8
    seq2 = rt.new_request(ctrl).spawn()
    r = rt.submit([StepInput(seq2, [1, 2, 3], None)]).wait().results[0]
    assert r.status == "error" and "proc_exit(7)" in r.error


def test_initialize_trap_ends_only_its_sequence_with_a_clear_error(rt):
    """_initialize runs on a worker before the first call (never on the engine's thread)."""
    body = OK_EXPORTS + MID_PROCESS + '(func (export "_initialize") unreachable)'
    seq = rt.new_request(rt.load(wat(body))).spawn()
    r = rt.submit([StepInput(seq, [1])]).wait().results[0]
    assert r.status == "error" and r.error.startswith("_initialize: trap: wasm `unreachable` instruction executed"), r.error


def test_a_misaligned_cabi_realloc_pointer_ends_only_that_sequence(rt):
    body = OK_EXPORTS.replace("(local.get $p))", "(i32.add (local.get $p) (i32.const 1)))") + MID_PROCESS
    seq = rt.new_request(rt.load(wat(body))).spawn()
    r = rt.submit([StepInput(seq, [1, 2])]).wait().results[0]
    assert r.status == "error" and "misaligned or outside linear memory" in r.error, r.error


def test_fd_write_work_is_bounded(rt):
    """Host work cannot be interrupted by the epoch clock, so one WASI call is bounded in size."""
    body = """
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
""" + OK_EXPORTS + MID_PROCESS.replace('(func (export "mid-process")', "(func $unused") + """
  (func (export "mid-process") (param i32 i32 i32 i32 i32 i32 i32) (result i32)
    (drop (call $fd_write (i32.const 1) (i32.const 400) (i32.const 65535) (i32.const 500)))
    (i32.const 16))
"""
    seq = rt.new_request(rt.load(wat(body))).spawn()
    r = rt.submit([StepInput(seq, [1])]).wait().results[0]
    assert r.status == "error" and "65535 iovecs is over the limit of 1024" in r.error, r.error
