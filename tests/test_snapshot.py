"""Init snapshots (aicirt.loader.snapshot): a controller's state after its init is what it would be
without the snapshot; a controller that breaks the init rules gets a clear
load error; snapshots are cached on disk per (module, tokenizer); fork still copies globals."""
from __future__ import annotations

import struct

import numpy as np
import pytest
import wasmtime
from hypothesis import given, settings
from hypothesis import strategies as st
from conftest import mask_tokens

import aicirt
from aicirt import LoadError, StepInput
from aicirt.build import toolchain
from aicirt.loader import snapshot as snap
from aicirt.loader.controller import load_controller
from aicirt.loader.wasm_binary import memory_runs, snapshot_module

HOST = "aici:controller/host@0.1.0"
IMPORTS = f"""
  (import "{HOST}" "vocab-size" (func $vocab_size (result i32)))
  (import "{HOST}" "token-trie" (func $token_trie (param i32)))
  (import "{HOST}" "arg" (func $arg (param i32)))
  (import "{HOST}" "var-get" (func $var_get (param i32 i32 i32)))
  (import "{HOST}" "self-seq-id" (func $seq_id (result i32)))
"""
# A bump allocator from 4096; `_initialize` traps when run twice (as wasi-libc's guard does).
BASE = """
  (memory (export "memory") 1)
  (global $bump (mut i32) (i32.const 4096))
  (global $token (mut i32) (i32.const 0))
  (global $ctors (mut i32) (i32.const 0))
  (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $bump))
    (global.set $bump (i32.add (global.get $bump) (local.get 3)))
    (if (i32.gt_u (global.get $bump) (i32.mul (memory.size) (i32.const 65536)))
      (then (drop (memory.grow (i32.const 16)))))
    (local.get $p))
  (func (export "_initialize")
    (if (i32.load8_u (i32.const 8)) (then unreachable))
    (i32.store8 (i32.const 8) (i32.const 1))
    (global.set $ctors (i32.add (global.get $ctors) (i32.const 1))))
  (data (i32.const 16) "\\40\\00\\00\\00\\01\\00\\00\\00")            ;; result: branches ptr 64, len 1
  (data (i32.const 64) "\\01\\00\\00\\00\\80\\00\\00\\00\\09\\00\\00\\00")   ;; mask some, ptr 128, len 9
  ;; mid-process allows the token init chose (vocab - 2, from a host call), 0 without init
  (func (export "mid-process") (param i32 i32 i32 i32 i32 i32 i32) (result i32)
    (memory.fill (i32.const 128) (i32.const 0) (i32.const 36))
    (i32.store (i32.add (i32.const 128) (i32.shl (i32.shr_u (global.get $token) (i32.const 5)) (i32.const 2)))
               (i32.shl (i32.const 1) (i32.and (global.get $token) (i32.const 31))))
    (i32.const 16))
"""
# init: remember vocab - 2, fetch the token trie (its header and size kept at 1024)
GOOD_INIT = """
  (func (export "aicirt_init")
    (global.set $token (i32.sub (call $vocab_size) (i32.const 2)))
    (call $token_trie (i32.const 1024)))
"""


def wat(body: str) -> bytes:
    return wasmtime.wat2wasm(f"(module {IMPORTS} {BASE} {body})")


def first_mask(rt, ctrl) -> list[int]:
    seq = rt.new_request(ctrl).spawn()
    out = rt.submit([StepInput(seq, [1, 2], None)]).wait()
    assert out.results[0].status == "ok", out.results[0].error
    tokens = mask_tokens(out, out.results[0].branches[0].mask_row)
    seq.close()
    return tokens


def plain(rt, src):
    """The controller as loaded without snapshots."""
    return load_controller(rt.engine, rt.engine_key, src, max_bytes=rt.limits.upload_bytes,
                           compile_timeout_s=rt.limits.compile_timeout_s, cache_dir=None,
                           memory_bytes=rt.limits.memory_bytes)


def state(seq) -> tuple[bytes, dict]:
    data = seq.memory.read(seq.store, 0, seq.memory.data_len(seq.store))
    return bytes(data), {i: g.value(seq.store) for i, g in seq._globals.items()}


def test_init_state_is_the_state_without_a_snapshot(rt):
    ctrl = rt.load(wat(GOOD_INIT))
    assert ctrl.snapshot and ctrl.has_init and not ctrl.has_initialize
    assert first_mask(rt, ctrl) == [255]         # vocab 257 - 2: init's host call, seen by mid-process
    memory, values = snap.run_init(rt.engine, plain(rt, wat(GOOD_INIT)), rt._init_host, rt.limits)
    seq = rt.new_request(ctrl).spawn()
    got_memory, got_values = state(seq)
    assert got_memory == memory and got_values == values
    trie_ptr, trie_len = struct.unpack("<II", memory[1024:1032])
    assert memory[trie_ptr:trie_ptr + trie_len] == rt._init_host.trie()
    assert values[2] == 1                        # `_initialize` ran once, before init, and not again


def test_json_controller_snapshot_state_and_masks_match(rt):
    src = toolchain.build_cached("json")
    ctrl = rt.load(src)
    assert ctrl.snapshot
    memory, values = snap.run_init(rt.engine, plain(rt, src), rt._init_host, rt.limits)
    seq = rt.new_request(ctrl).spawn()
    assert state(seq) == (memory, values)
    schema = '{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}},"required":["a","b"]}'
    tokens: list[list[int]] = []
    for c in (ctrl, plain(rt, src)):
        s = rt.new_request(c, schema).spawn()
        toks, seen = [1, 2], []
        for text in ('{"a":1', ',"b":"x', '"}'):
            out = rt.submit([StepInput(s, toks, None)]).wait()
            r = out.results[0]
            assert r.status == "ok" and r.branches, (r.error, r.logs)
            seen.append(mask_tokens(out, r.branches[0].mask_row) if r.branches[0].mask_row is not None else r.branches)
            toks = toks + list(text.encode())
        tokens.append(seen)
        s.close()
    assert tokens[0] == tokens[1]


def test_loading_again_reuses_the_snapshot_and_close_lets_it_go(make_rt):
    runtime = make_rt()
    first = runtime.load(wat(GOOD_INIT))
    assert runtime.load(wat(GOOD_INIT)).module is first.module      # not deserialized again
    runtime.close()
    assert runtime._init_host.modules == {} and first.module is None   # the engine is not kept alive


def test_fork_of_a_snapshot_copies_globals(rt):
    ctrl = rt.load(wat(GOOD_INIT))
    parent = rt.new_request(ctrl).spawn()
    child, = parent.fork_many(1)
    for idx, g in parent._globals.items():
        assert child._globals[idx].value(child.store) == g.value(parent.store)
    assert state(child) == state(parent)


@pytest.mark.parametrize("init, needle", [
    ('(func (export "aicirt_init") (call $var_get (i32.const 0) (i32.const 0) (i32.const 1024)))',
     "called host import `var-get`"),
    ('(func (export "aicirt_init") (drop (call $seq_id)))', "called host import `self-seq-id`"),
    ('(func (export "aicirt_init") unreachable)', "`aicirt_init` (per-tokenizer init, run at load) failed: "),
    ('(func (export "aicirt_init") (param i32))', "export `aicirt_init` (the per-tokenizer init) has type (i32) -> ()"),
])
def test_init_that_breaks_the_rules_is_a_load_error(rt, init, needle):
    with pytest.raises(LoadError) as e:
        rt.load(wat(init))
    assert needle in str(e.value)


def test_init_arg_is_empty_where_the_module_fixes_none_of_it(rt):
    """An init's `arg` is what the module fixes of every request's argument, where the init depends
    on it (a js script bound with aici.init: tests/test_js_init.py); here nothing: an empty list."""
    ctrl = rt.load(wat('(func (export "aicirt_init") (i32.store (i32.const 1024) (i32.const 7)) '
                       '(i32.store (i32.const 1028) (i32.const 7)) (call $arg (i32.const 1024)))'))
    seq = rt.new_request(ctrl, b"the request's").spawn()
    assert ctrl.snapshot and bytes(seq.memory.read(seq.store, 1024, 1032)) == bytes(8)


def test_init_log_and_wasi_output_are_in_the_load_error(rt):
    body = """
      (data (i32.const 300) "hello from init\\n")
      (data (i32.const 400) "\\2c\\01\\00\\00\\10\\00\\00\\00")          ;; iovec {300, 16}
      (func (export "aicirt_init")
        (drop (call $fd_write (i32.const 1) (i32.const 400) (i32.const 1) (i32.const 500)))
        unreachable)"""
    src = wasmtime.wat2wasm(f'(module (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) '
                            f'(result i32))) {IMPORTS} {BASE} {body})')
    with pytest.raises(LoadError, match=r"unreachable.*its log: hello from init"):
        rt.load(src)


def test_init_past_the_time_limit_is_a_load_error(rt, make_rt):
    src = wat('(func (export "aicirt_init") (loop $l (br $l)))')
    plain(rt, src)                               # compiled (and cached) under the usual limit
    runtime = make_rt(compile_timeout_s=0.5)
    with pytest.raises(LoadError, match="ran past the time limit of 0.5 s"):
        runtime.load(src)


def test_without_init_export_nothing_changes(rt):
    ctrl = rt.load(wat(""))
    assert not ctrl.snapshot and ctrl.has_initialize
    assert first_mask(rt, ctrl) == [0]


def test_snapshot_cached_on_disk_per_tokenizer(tmp_path, monkeypatch):
    src = wat(GOOD_INIT)
    with aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=tmp_path) as runtime:
        runtime.load(src)
    assert len(list((tmp_path / "modules").glob(f"*-s{snap.SNAPSHOT_FORMAT}.cwasm"))) == 1
    monkeypatch.setattr(snap, "run_init_sparse", lambda *a: pytest.fail("the cached snapshot was not used"))
    import aicirt.loader.controller as cmod
    monkeypatch.setattr(cmod, "_artifacts", type(cmod._artifacts)())   # no process cache: disk only
    with aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=tmp_path) as runtime:
        ctrl = runtime.load(src)
        assert ctrl.snapshot and first_mask(runtime, ctrl) == [255]


class _OtherBytes(aicirt.ByteTokenizer):
    """The byte tokenizer with EOS moved: another tokenizer identity."""
    eos_token_id = 0


def test_tokenizer_identity_tells_tokenizers_apart():
    assert snap.tokenizer_identity(aicirt.ByteTokenizer()) == snap.tokenizer_identity(aicirt.ByteTokenizer())
    assert snap.tokenizer_identity(aicirt.ByteTokenizer()) != snap.tokenizer_identity(_OtherBytes())


def test_snapshot_module_rewrite():
    src = wasmtime.wat2wasm("""(module (memory (export "memory") 1 100) (global $g (mut i32) (i32.const 5))
      (global $f (mut f64) (f64.const 1.5)) (data (i32.const 10) "abc") (data "passive")
      (func $start (global.set $g (i32.const 9))) (start $start)
      (func (export "init")) (func (export "get") (result i32) (global.get $g))
      (func (export "grab") (memory.init 1 (i32.const 200) (i32.const 0) (i32.const 7))))""")
    memory = bytearray(3 * 65536)
    memory[70000:70003] = b"xyz"
    out = snapshot_module(src, bytes(memory), {0: -7, 1: 2.25}, {"init"})
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    inst = wasmtime.Instance(store, wasmtime.Module(engine, out), [])
    ex = inst.exports(store)
    assert "init" not in ex and ex["get"](store) == -7         # no start function: -7, not 9
    mem = ex["memory"]
    assert mem.data_len(store) == 3 * 65536
    assert mem.read(store, 10, 13) == b"\0\0\0" and mem.read(store, 70000, 70003) == b"xyz"
    ex["grab"](store)                                             # passive segments keep their index
    assert mem.read(store, 200, 207) == b"passive"
    assert memory_runs(bytes(65536 * 2)) == []


@settings(max_examples=40, deadline=None)
@given(pages=st.integers(1, 4), writes=st.lists(st.tuples(st.integers(0, 4 * 65536 - 1), st.binary(min_size=1, max_size=300)),
                                                 max_size=8),
       g32=st.integers(-(1 << 31), (1 << 31) - 1), g64=st.integers(-(1 << 63), (1 << 63) - 1),
       f32=st.floats(width=32, allow_nan=False), f64=st.floats(allow_nan=False), sparse=st.booleans())
def test_snapshot_module_holds_any_memory_and_globals(pages, writes, g32, g64, f32, f64, sparse):
    src = wasmtime.wat2wasm("""(module (memory (export "memory") 1) (data (i32.const 100) "seg")
      (global (export "a") (mut i32) (i32.const 1)) (global (export "b") (mut i64) (i64.const 2))
      (global (export "c") (mut f32) (f32.const 3)) (global (export "d") (mut f64) (f64.const 4))
      (global (export "k") i32 (i32.const 7)))""")
    memory = bytearray(pages * 65536)
    for off, data in writes:
        data = data[:len(memory) - off] if off < len(memory) else b""
        memory[off:off + len(data)] = data
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    if sparse:   # what a load does: the written bytes only (snapshot.written_runs)
        runs = snap.written_runs(np.frombuffer(bytes(memory), np.uint8))
        out = snapshot_module(src, len(memory), {0: g32, 1: g64, 2: f32, 3: f64}, set(), runs=runs)
    else:
        out = snapshot_module(src, bytes(memory), {0: g32, 1: g64, 2: f32, 3: f64}, set())
    ex = wasmtime.Instance(store, wasmtime.Module(engine, out), []).exports(store)
    mem = ex["memory"]
    assert bytes(mem.read(store, 0, mem.data_len(store))) == bytes(memory)
    assert [ex[n].value(store) for n in "abcdk"] == [g32, g64, f32, f64, 7]


# --- a snapshot costs what the init wrote -----------------------------------------------------------
# init: grow to 64 MiB and write one byte in every 64 KiB page (a 600-byte upload)
SPARSE_INIT = """
  (func (export "aicirt_init") (local $p i32)
    (drop (memory.grow (i32.const 1023)))
    (local.set $p (i32.const 65536))
    (loop $l
      (i32.store8 (local.get $p) (i32.const 7))
      (local.set $p (i32.add (local.get $p) (i32.const 65536)))
      (br_if $l (i32.lt_u (local.get $p) (i32.const 67108864))))
    (global.set $token (i32.sub (call $vocab_size) (i32.const 2))))
"""


def test_a_sparse_init_makes_a_small_snapshot_with_the_same_state(rt):
    src = wat(SPARSE_INIT)
    ctrl = rt.load(src)
    assert ctrl.snapshot
    assert len(ctrl.module.serialize()) < 1 << 20            # was 64 MiB: every touched 64 KiB block
    memory, values = snap.run_init(rt.engine, plain(rt, src), rt._init_host, rt.limits)
    assert len(memory) == 64 << 20
    seq = rt.new_request(ctrl).spawn()
    assert state(seq) == (memory, values)
    seq.close()
    assert first_mask(rt, ctrl) == [255]


def test_written_runs_hold_exactly_the_non_zero_bytes(monkeypatch):
    rng = np.random.default_rng(5)
    memory = np.zeros(4 * 65536, np.uint8)
    for off in rng.integers(0, len(memory) - 200, size=300):
        memory[off:off + rng.integers(1, 200)] = rng.integers(0, 256, dtype=np.uint8)
    for max_segments in (snap._MAX_SEGMENTS, 7):   # past the cap, longer gaps merge: fewer, longer runs
        monkeypatch.setattr(snap, "_MAX_SEGMENTS", max_segments)
        runs = snap.written_runs(memory)
        assert len(runs) < max_segments
        again = np.zeros_like(memory)
        for off, data in runs:
            assert data[:1] != b"\0" and data[-1:] != b"\0"   # a run starts and ends on a written byte
            again[off:off + len(data)] = np.frombuffer(data, np.uint8)
        assert np.array_equal(again, memory)
        assert [off for off, _ in runs] == sorted(off for off, _ in runs)
    assert snap.written_runs(np.zeros(65536, np.uint8)) == []


def test_a_failed_init_is_remembered_per_module_and_tokenizer(make_rt, monkeypatch):
    runtime = make_rt()
    src = wat('(func (export "aicirt_init") unreachable)')
    with pytest.raises(LoadError, match="per-tokenizer init, run at load") as first:
        runtime.load(src)
    assert "remembered" not in str(first.value)
    ran = []
    real = snap.run_init_sparse
    monkeypatch.setattr(snap, "run_init_sparse", lambda *a: ran.append(1) or real(*a))
    with pytest.raises(LoadError, match="remembered: this init failed") as again:
        runtime.load(src)
    assert str(first.value) in str(again.value) and ran == []       # not run again
    assert runtime.load(wat(GOOD_INIT)).snapshot                      # another module loads as ever
    other = make_rt()                                                 # a runtime of its own: its own record
    with pytest.raises(LoadError):
        other.load(src)
    assert ran == [1]
    clock = snap._now() + snap.INIT_FAILURE_TTL_S + 1                 # once the time has passed, it runs again
    monkeypatch.setattr(snap, "_now", lambda: clock)
    with pytest.raises(LoadError) as later:
        runtime.load(src)
    assert "remembered" not in str(later.value) and ran == [1, 1]
