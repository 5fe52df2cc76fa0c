"""Property tests over everything that parses untrusted bytes (issue 10 item 6): module
validation and rewriting, the fork-safety decoder, result lifting from arbitrary guest memory,
host-import arguments, the token-trie path. The targets live in tests/fuzz/ (atheris runs the
same ones on demand: tests/fuzz/fuzz_parsers.py). The HTTP server's request parsing has its
own file, tests/test_server_fuzz.py."""
from __future__ import annotations

import wasmtime
from _budget import examples
from fuzz import host_targets, targets
from fuzz.mutate import mutate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aicirt
from aicirt import StepInput
from aicirt import LoadError

# A controller with one of everything the parsers read: imports, a table with elements, data
# segments (active and passive), globals with extended constant offsets, SIMD, bulk memory,
# reference types, br_table, call_indirect. (Not constant expressions that run code, such as
# global.get offsets: instantiation still fails on those, see the hostile suite's xfails.)
RICH = wasmtime.wat2wasm(r"""(module
  (import "aici:controller/host@0.1.0" "log" (func $log (param i32 i32)))
  (type $t (func (param i32) (result i32)))
  (memory (export "memory") 2)
  (table 8 funcref)
  (global $bump (mut i32) (i32.const 8192))
  (global $f (mut f64) (f64.const 1.5))
  (elem (i32.const 2) $id $id)
  (data (i32.const 4112) "\01\02\03")
  (data (i32.const 16) "\40\00\00\00\01\00\00\00")
  (data (i32.const 64) "\01\00\00\00\80\00\00\00\09\00\00\00")
  (data (i32.const 136) "\02")
  (data $p "passive")
  (func $id (type $t) (local.get 0))
  (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32)
    (local $p i32) (local.set $p (global.get $bump))
    (global.set $bump (i32.add (global.get $bump) (local.get 3))) (local.get $p))
  (func (export "mid-process") (param i32 i32 i32 i32 i32 i32 i32) (result i32)
    (local $v v128)
    (local.set $v (i8x16.shuffle 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 (v128.const i32x4 1 2 3 4) (v128.load (i32.const 0))))
    (v128.store offset=1024 (i32.const 0) (local.get $v))
    (memory.fill (i32.const 2048) (i32.const 0) (i32.const 16))
    (memory.copy (i32.const 2064) (i32.const 2048) (i32.const 16))
    (memory.init $p (i32.const 3000) (i32.const 0) (i32.const 3))
    (block $a (block $b (br_table $a $b $a (local.get 0))))
    (drop (call_indirect (type $t) (i32.const 7) (i32.const 2)))
    (drop (ref.is_null (ref.func $id)))
    (drop (table.size 0))
    (drop (f64.add (global.get $f) (f64.const 2)))
    (i32.const 16)))""")

MUTATE = dict(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def mutated(draw, base: bytes = RICH):
    return mutate(draw, base, start=8, inserts=st.integers(0, 255).map(lambda b: bytes([b])),
                  overwrites=st.sampled_from([0x00, 0x0B, 0x26, 0x7F, 0x80, 0xFC, 0xFD, 0xFF]))


def test_the_rich_module_is_a_runnable_controller(rt):
    seq = rt.new_request(rt.load(RICH)).spawn()
    assert rt.submit([StepInput(seq, [1])]).wait().results[0].status == "ok"


@settings(**MUTATE)
@given(mutated())
def test_module_parsers_on_mutated_modules(wasm):
    targets.module_parsers(wasm)


@settings(**MUTATE)
@given(st.binary(max_size=300).map(lambda b: b"\0asm\x01\0\0\0" + b))
def test_module_parsers_on_arbitrary_bytes(wasm):
    targets.module_parsers(wasm)


_rt: dict = {}


def _runtime():
    if not _rt:
        _rt["rt"] = aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False, workers=1)
    return _rt["rt"]


@settings(max_examples=examples(60), deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_what_the_loader_accepts_instantiates(wasm):
    """The loader's checks are complete: a mutated module it accepts never fails to instantiate
    (the failures it used to let through: start functions, out-of-bounds segments...)."""
    rt = _runtime()
    try:
        ctrl = rt.load(wasm)
    except LoadError:
        return
    try:
        seq = rt.new_request(ctrl).spawn()
    except aicirt.ControllerError as e:
        assert "_initialize" in str(e), f"accepted at load, refused at spawn: {e}"
        return
    seq.close()


@settings(max_examples=examples(500), deadline=None)
@given(st.binary(min_size=8, max_size=600))
def test_result_lifting_from_arbitrary_memory(data):
    targets.lifted_result(data)


@st.composite
def small_structured_memory(draw):
    """Memory whose words are mostly small (valid-looking pointers, lengths and tags)."""
    import struct
    n = draw(st.integers(0, 7))
    ptr = draw(st.integers(0, 64))
    words = draw(st.lists(st.one_of(st.integers(0, 300), st.sampled_from([0, 1, 9, 28, 0xFFFFFFFF]),
                                    st.integers(0, 2**32 - 1)), min_size=8, max_size=120))
    return struct.pack("<II", ptr, n) + struct.pack(f"<{len(words)}I", *words)


@settings(max_examples=examples(500), deadline=None)
@given(small_structured_memory())
def test_result_lifting_from_structured_memory(data):
    targets.lifted_result(data)


ARG_WORD = st.one_of(st.integers(0, 300), st.integers(8192, 8400), st.integers(0, 2**32 - 1),
                     st.sampled_from([0, 0xFFFFFFFF, 0x7FFFFFFF, 65536 * 4 - 4]))


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 255), ARG_WORD, ARG_WORD, ARG_WORD, ARG_WORD, st.binary(max_size=64))
def test_host_import_arguments(selector, a, b, c, d, tail):
    host_targets.host_call(host_targets.words(selector, a, b, c, d, tail))


@settings(max_examples=examples(300), deadline=None)
@given(st.binary(max_size=2000))
def test_token_trie_round_trip(data):
    targets.trie_round_trip(data)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=6), min_size=1, max_size=300))
def test_token_trie_round_trip_with_shared_prefixes(tokens):
    targets.trie_round_trip(b"\xff".join(tokens))
