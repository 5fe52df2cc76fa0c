"""WASI preview 1 (docs/wasi.md): native in the hot path (native/wasi.c); runtime/host/wasi.py serves
the template instance of a per-tokenizer init."""
from __future__ import annotations

import struct

import pytest
from test_controller_loading import MID_PROCESS, OK_EXPORTS, wat

from aicirt import StepInput
from aicirt.native.wasi_rng import random_bytes, seed, split
from aicirt.host.wasi import exit_message

IMPORTS = """
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "random_get" (func $random_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "clock_time_get" (func $clock (param i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "clock_res_get" (func $res (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "args_sizes_get" (func $args (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_seek" (func $seek (param i32 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
"""
# mid-process: clock -> 520 (errno 500), random 16 bytes -> 600 (errno 504), fd_write to fd 5
# (errno 508), args sizes -> 540/544 (errno 512), fd_seek (errno 516), clock id 9 (errno 548),
# res -> 560; a call whose first token is 99 writes two log lines to stderr and exits with 3.
BODY = """
  (data (i32.const 300) "first line\\nError: bad thing\\n    at f (x.js:1)\\n")
  (data (i32.const 400) "\\2c\\01\\00\\00\\2e\\00\\00\\00")          ;; iovec {300, 46}
  (func (export "mid-process") (param i32 i32 i32 i32 i32 i32 i32) (result i32)
    (i32.store (i32.const 500) (call $clock (i32.const 1) (i64.const 0) (i32.const 520)))
    (i32.store (i32.const 504) (call $random_get (i32.const 600) (i32.const 16)))
    (i32.store (i32.const 508) (call $fd_write (i32.const 5) (i32.const 400) (i32.const 1) (i32.const 580)))
    (i32.store (i32.const 512) (call $args (i32.const 540) (i32.const 544)))
    (i32.store (i32.const 516) (call $seek (i32.const 1) (i64.const 0) (i32.const 0) (i32.const 584)))
    (i32.store (i32.const 548) (call $clock (i32.const 9) (i64.const 0) (i32.const 528)))
    (drop (call $res (i32.const 0) (i32.const 560)))
    (if (i32.and (i32.gt_u (local.get 2) (i32.const 0)) (i32.eq (i32.load (local.get 1)) (i32.const 99)))
      (then (drop (call $fd_write (i32.const 2) (i32.const 400) (i32.const 1) (i32.const 580)))
            (call $exit (i32.const 3))))
    (i32.const 16))
"""


@pytest.fixture
def rt_ctrl(make_rt):
    rt = make_rt()
    return rt, rt.load(wat(IMPORTS + OK_EXPORTS + BODY + MID_PROCESS.split("(func")[0]))


def read(seq, start: int, end: int) -> bytes:
    return seq.memory.read(seq.store, start, end)


def test_clocks_are_virtual_and_the_rest_answers_cleanly(rt_ctrl):
    rt, ctrl = rt_ctrl
    seq = rt.new_request(ctrl, b"a").spawn()
    times = []
    for tokens in ([1], [1, 2], [1, 2, 3]):
        r = rt.submit([StepInput(seq, tokens)]).wait().results[0]
        assert r.status == "ok", r.error
        times.append(struct.unpack("<Q", read(seq, 520, 528))[0])
    assert times == [1_000_000, 2_000_000, 3_000_000]   # 1 ms a call, never the wall clock
    errnos = struct.unpack("<5I", read(seq, 500, 520))
    assert errnos == (0, 0, 8, 0, 52)                    # clock, random, EBADF, args, ENOSYS (fd_seek)
    assert struct.unpack("<I", read(seq, 548, 552)) == (28,)          # an unknown clock: EINVAL
    assert struct.unpack("<II", read(seq, 540, 548)) == (0, 0)        # no arguments
    assert struct.unpack("<Q", read(seq, 560, 568)) == (1_000_000,)   # resolution 1 ms


def test_random_is_seeded_by_the_request_and_split_at_a_fork(rt_ctrl):
    rt, ctrl = rt_ctrl

    def first_draw(arg: bytes) -> bytes:
        seq = rt.new_request(ctrl, arg).spawn()
        assert rt.submit([StepInput(seq, [1])]).wait().results[0].status == "ok"
        return read(seq, 600, 616)
    assert first_draw(b"x") == first_draw(b"x") == random_bytes(seed(b"x"), 16)[1]   # C and Python agree
    assert first_draw(b"y") != first_draw(b"x")
    seq = rt.new_request(ctrl, b"x").spawn()
    assert rt.submit([StepInput(seq, [1])]).wait().results[0].status == "ok"
    child = seq.fork()
    out = rt.submit([StepInput(seq, [1, 2]), StepInput(child, [1, 2])]).wait()
    assert all(r.status == "ok" for r in out.results)
    state, _ = random_bytes(seed(b"x"), 16)
    parent_state, child_seed = split(state)
    assert read(seq, 600, 616) == random_bytes(parent_state, 16)[1]
    assert read(child, 600, 616) == random_bytes(child_seed, 16)[1] != read(seq, 600, 616)


def test_proc_exit_quotes_the_calls_last_log_entry(rt_ctrl):
    rt, ctrl = rt_ctrl
    seq = rt.new_request(ctrl).spawn()
    r = rt.submit([StepInput(seq, [99])]).wait().results[0]
    assert r.status == "error"
    assert r.error == "controller exited with proc_exit(3): Error: bad thing | at f (x.js:1)"
    assert exit_message(3, b"first line\nError: bad thing\n    at f (x.js:1)\n") == r.error
    assert exit_message(1, b"") == "controller exited with proc_exit(1)"
    assert len(exit_message(1, b"x" * 1000)) <= 255
