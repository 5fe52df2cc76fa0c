"""The SDK's allocator never returns NULL: out of guest memory is a trap, so the sequence ends in
error instead of writing through NULL (address 0 is ordinary linear memory in Wasm: no fault)."""
from __future__ import annotations

import io

import pytest

from aicirt.runner.run import RunFailed, run

# Each mode asks for memory the instance cannot have (64 MiB by default, docs/protocol.md#limits), writes
# through what it got, and would then fast-forward "survived": with a NULL it would get there.
SOURCE = r"""
#include "aici.h"
void aici_step(const aici_arg_t *arg, aici_result_t *res) {
  uint32_t n;
  const char *mode = (const char *)aici_arg(&n);
  char *p = 0;
  if (!__builtin_strcmp(mode, "exhaust"))
    for (int i = 0; i < 1000; i++) { p = aici_malloc(1 << 20); p[0] = 1; }
  else if (!__builtin_strcmp(mode, "huge")) p = aici_malloc(0x7fff0001u);
  else if (!__builtin_strcmp(mode, "calloc")) p = aici_calloc(0x10000, 0x10001);
  else if (!__builtin_strcmp(mode, "realloc")) p = aici_realloc(aici_malloc(16), 0x40000000u);
  else if (!__builtin_strcmp(mode, "tmp")) p = aici_tmp_alloc(0x50000000u);
  else p = aici_malloc(64);
  p[0] = 'x';
  static const aici_token_t ok[] = {'s', 'u', 'r', 'v', 'i', 'v', 'e', 'd'};
  if (arg->call_index == 0) aici_ff(res, 0, ok, 8);
}
"""


@pytest.fixture(scope="module")
def alloc_c(tmp_path_factory):
    path = tmp_path_factory.mktemp("alloc") / "alloc.c"
    path.write_text(SOURCE)
    return path


def go(src, mode: str):
    return run(str(src), arg=mode.encode(), prompt="hi", model="scripted", out=io.StringIO(), err=io.StringIO())


@pytest.mark.parametrize("mode", ["exhaust", "huge", "calloc", "realloc", "tmp"])
def test_out_of_memory_traps(alloc_c, mode):
    with pytest.raises(RunFailed, match="aici: out of guest memory allocating.*unreachable"):
        go(alloc_c, mode)


def test_memory_it_can_have_is_allocated(alloc_c):
    assert go(alloc_c, "small")["sequences"][0]["text"] == "survived"
