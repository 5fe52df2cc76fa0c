"""Loading: validation names what is wrong, the disk cache, the fork rewrite, the WASI shim."""
from __future__ import annotations

import struct
from pathlib import Path

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
    child, = parent.fork_many(1)
    assert child.memory.read(child.store, 70000, 70006) == b"state!"
    for idx, g in parent._globals.items():
        assert child._globals[idx].value(child.store) == g.value(parent.store)


def test_compiled_module_cached_on_disk(tmp_path, scripted_wasm):
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
    assert (nwritten, path_open, random_get, clock) == (18, 52, 0, 0)   # ENOSYS for files (docs/wasi.md)
    # the virtual clock: 1 ms a mid-process call (this is the first); randomness seeded by the request
    assert struct.unpack("<Q", seq.memory.read(seq.store, 520, 528)) == (1_000_000,)
    assert seq.memory.read(seq.store, 600, 608) != b"\0" * 8
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


# -- limits that hold: refused before compiling, the same verdict from `aicirt check` -------------
def _bomb(n: int = 20000) -> bytes:
    """A 290 KB module whose one function takes cranelift ~6 s here: `n` nested blocks, each
    writing a local and branching out, over `n` locals (SSA construction goes quadratic)."""
    def leb(v):
        out = bytearray()
        while True:
            b, v = v & 0x7F, v >> 7
            out.append(b | 0x80 if v else b)
            if not v:
                return bytes(out)
    ops = bytearray()
    for i in range(n):
        ops += b"\x02\x40\x20" + leb(i) + b"\x21" + leb((i * 7 + 1) % n) + b"\x20" + leb(i) + b"\x0d" + leb(i // 2)
    body = b"\x01" + leb(n) + b"\x7f" + bytes(ops) + b"\x0b" * n + b"\x0b"
    sec = lambda i, p: bytes([i]) + leb(len(p)) + p   # noqa: E731
    return (b"\0asm\x01\0\0\0" + sec(1, b"\x01\x60\x00\x00") + sec(3, b"\x01\x00")
            + sec(10, b"\x01" + leb(len(body)) + body))


def _children() -> list[int]:
    import os
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid():
            out.append(int(stat.parent.name))
    return out


REFUSED = [
    ('(memory (export "memory") 2000)' + OK_EXPORTS.split("\n", 2)[2] + MID_PROCESS,
     "memory 0: initial size 125 MiB is over the memory limit of 64 MiB"),
    (OK_EXPORTS + "(memory 1)" + MID_PROCESS, "defines 2 memories"),
    (OK_EXPORTS.replace('(memory (export "memory") 1)', '(memory (export "memory") 1 1 shared)') + MID_PROCESS,
     "memory 0 is shared"),
    (OK_EXPORTS + "(table 100000 funcref)" + MID_PROCESS, "table 0: initial size of 100000 elements is over"),
    (OK_EXPORTS + "(table 1 funcref) (table 1 funcref)" + MID_PROCESS, "defines 2 tables"),
    (OK_EXPORTS + MID_PROCESS + "(func $s) (start $s)", "has a start function (function 2)"),
    (OK_EXPORTS + MID_PROCESS + '(data (i32.const 65530) "0123456789")', "data segment 3: bytes [65530, 65540)"),
    (OK_EXPORTS + MID_PROCESS + "(table 2 funcref) (func $f) (elem (i32.const 1) $f $f)",
     "element segment 0: elements [1, 3) are outside table 0's initial 2 elements"),
    ('(import "wasi_snapshot_preview1" "fd_write" (func (param i32) (result i32)))' + OK_EXPORTS + MID_PROCESS,
     "`fd_write` has type (i32) -> (i32), expected (i32, i32, i32, i32) -> (i32)"),
    ('(import "wasi_snapshot_preview1" "sock_open" (func (param i32) (result i32)))' + OK_EXPORTS + MID_PROCESS,
     "`sock_open` is not a wasi_snapshot_preview1 function"),
    (OK_EXPORTS + MID_PROCESS + "(table 1 funcref) (func (table.set 0 (i32.const 0) (ref.null func)))",
     "function 2 uses `table.set`"),
    (OK_EXPORTS + MID_PROCESS + "(table 1 funcref) (func (drop (table.grow 0 (ref.null func) (i32.const 1))))",
     "uses `table.grow`"),
    (OK_EXPORTS + MID_PROCESS + '(data $p "xy") (func (data.drop $p))', "uses `data.drop`"),
    (OK_EXPORTS + MID_PROCESS + "(table 1 funcref) (func $f) (elem $e func $f) (func (elem.drop $e))",
     "uses `elem.drop`"),
    (OK_EXPORTS + MID_PROCESS + "(table 1 funcref) (func $f) (elem $e func $f)"
                                "(func (table.init $e (i32.const 0) (i32.const 0) (i32.const 1)))", "uses `table.init`"),
]


@pytest.mark.parametrize("body, needle", REFUSED, ids=[n.split()[0] + str(i) for i, (_, n) in enumerate(REFUSED)])
def test_runtime_and_check_refuse_the_same_modules_and_cache_nothing(tmp_path, body, needle):
    from aicirt.loader.controller import check_controller

    wasm = wat(body)
    with aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=tmp_path) as runtime:
        with pytest.raises(LoadError) as by_runtime:
            runtime.load(wasm)
    with pytest.raises(LoadError) as by_check:
        check_controller(wasm)
    assert needle in str(by_runtime.value) and str(by_check.value) == str(by_runtime.value)
    assert not list(tmp_path.rglob("*.cwasm"))


def test_what_the_runtime_accepts_check_accepts_and_it_runs(rt):
    from aicirt.loader.controller import check_controller

    body = OK_EXPORTS + MID_PROCESS + "(table 10000 funcref) (func $f) (elem (i32.const 9998) $f $f)"
    check_controller(wat(body))
    seq = rt.new_request(rt.load(wat(body))).spawn()
    assert rt.submit([StepInput(seq, [1])]).wait().results[0].status == "ok"


@pytest.mark.timing
def test_a_compile_past_the_limit_is_stopped_and_not_cached(tmp_path):
    import resource

    def children_cpu_s() -> float:   # CPU time of this process's children that have been waited for
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    limits = aicirt.Limits(compile_timeout_s=0.5)
    bomb = _bomb()
    with aicirt.Runtime(aicirt.ByteTokenizer(), limits=limits, cache_dir=tmp_path) as runtime:
        c0 = children_cpu_s()
        with pytest.raises(LoadError, match=r"compiling took longer than 0.5 s \(stopped\)"):
            runtime.load(bomb)
        assert not _children(), "the compiler process outlived the refusal"
        # stopped, not left to finish: the compiler child used well under the ~6 s of CPU the
        # whole compile takes (CPU time: a busy machine gives it less in 0.5 s, never more)
        assert children_cpu_s() - c0 < 2.5
    assert not list(tmp_path.rglob("*.cwasm"))


@pytest.mark.parametrize("src", [memoryview(b"\0asm"), 3, None, 1.5])
def test_load_of_something_that_is_not_a_module_raises_load_error(rt, src):
    with pytest.raises(LoadError, match="a controller is a path or the module's bytes, not"):
        rt.load(src)


def test_cli_check_fails_on_what_the_runtime_refuses(tmp_path):
    from click.testing import CliRunner

    from cli import main

    path = tmp_path / "start.wasm"
    path.write_bytes(wat(OK_EXPORTS + MID_PROCESS + "(func $s) (start $s)"))
    out = CliRunner().invoke(main, ["check", str(path)])
    assert out.exit_code == 1 and "has a start function" in out.output


def test_the_child_compiles_for_the_runtimes_engine_so_nothing_compiles_in_process(monkeypatch):
    from aicirt.loader import controller

    def in_process(*_):
        raise AssertionError("compiled in this process, outside the killable child")
    monkeypatch.setattr(controller, "_compile_in_thread", in_process)
    fresh = wat(OK_EXPORTS + MID_PROCESS) + b"\x00\x05\x04once"
    with aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False) as runtime:
        seq = runtime.new_request(runtime.load(fresh)).spawn()
        assert runtime.submit([StepInput(seq, [1])]).wait().results[0].status == "ok"
    controller.check_controller(fresh + b"\x00\x02\x01x", limits=aicirt.Limits(memory_bytes=8 << 20))
