"""What the loader refuses before a module is compiled, and why (docs/protocol.md#wit, #limits, #implementation).

These are exactly the things instantiation or fork would otherwise fail on later, per sequence
and with worse messages: memories and tables the instance pool has no room for, a start
function (it would run outside any time limit), segments that do not fit, WASI imports whose
signature is not preview1's, and state fork cannot copy. `aicirt check` and `Runtime.load` both
run these checks (through :func:`aicirt.loader.controller.load_controller`), so they agree.
"""
from __future__ import annotations

from .wasm_binary import ModuleFacts

# The pooling allocator's per-table element limit (wasmtime's default, which the Runtime keeps).
MAX_TABLE_ELEMENTS = 20_000

_I, _L = "i32", "i64"
#: wasi_snapshot_preview1: name -> (params, results) of the core function.
WASI_SIGNATURES: dict[str, tuple[list[str], list[str]]] = {
    "args_get": ([_I, _I], [_I]), "args_sizes_get": ([_I, _I], [_I]),
    "environ_get": ([_I, _I], [_I]), "environ_sizes_get": ([_I, _I], [_I]),
    "clock_res_get": ([_I, _I], [_I]), "clock_time_get": ([_I, _L, _I], [_I]),
    "fd_advise": ([_I, _L, _L, _I], [_I]), "fd_allocate": ([_I, _L, _L], [_I]),
    "fd_close": ([_I], [_I]), "fd_datasync": ([_I], [_I]),
    "fd_fdstat_get": ([_I, _I], [_I]), "fd_fdstat_set_flags": ([_I, _I], [_I]),
    "fd_fdstat_set_rights": ([_I, _L, _L], [_I]), "fd_filestat_get": ([_I, _I], [_I]),
    "fd_filestat_set_size": ([_I, _L], [_I]), "fd_filestat_set_times": ([_I, _L, _L, _I], [_I]),
    "fd_pread": ([_I, _I, _I, _L, _I], [_I]), "fd_prestat_get": ([_I, _I], [_I]),
    "fd_prestat_dir_name": ([_I, _I, _I], [_I]), "fd_pwrite": ([_I, _I, _I, _L, _I], [_I]),
    "fd_read": ([_I, _I, _I, _I], [_I]), "fd_readdir": ([_I, _I, _I, _L, _I], [_I]),
    "fd_renumber": ([_I, _I], [_I]), "fd_seek": ([_I, _L, _I, _I], [_I]),
    "fd_sync": ([_I], [_I]), "fd_tell": ([_I, _I], [_I]),
    "fd_write": ([_I, _I, _I, _I], [_I]),
    "path_create_directory": ([_I, _I, _I], [_I]), "path_filestat_get": ([_I, _I, _I, _I, _I], [_I]),
    "path_filestat_set_times": ([_I, _I, _I, _I, _L, _L, _I], [_I]),
    "path_link": ([_I, _I, _I, _I, _I, _I, _I], [_I]),
    "path_open": ([_I, _I, _I, _I, _I, _L, _L, _I, _I], [_I]),
    "path_readlink": ([_I, _I, _I, _I, _I, _I], [_I]), "path_remove_directory": ([_I, _I, _I], [_I]),
    "path_rename": ([_I, _I, _I, _I, _I, _I], [_I]), "path_symlink": ([_I, _I, _I, _I, _I], [_I]),
    "path_unlink_file": ([_I, _I, _I], [_I]), "poll_oneoff": ([_I, _I, _I, _I], [_I]),
    "proc_exit": ([_I], []), "proc_raise": ([_I], [_I]), "sched_yield": ([], [_I]),
    "random_get": ([_I, _I], [_I]), "sock_accept": ([_I, _I, _I], [_I]),
    "sock_recv": ([_I, _I, _I, _I, _I, _I], [_I]), "sock_send": ([_I, _I, _I, _I, _I], [_I]),
    "sock_shutdown": ([_I, _I], [_I]),
}


def _mib(n: int) -> str:
    return f"{n / (1 << 20):g} MiB"


def structural_problems(facts: ModuleFacts, memory_bytes: int) -> list[str]:
    """Everything about memories, tables, start and segments that the runtime cannot run."""
    problems = []
    if len(facts.memories) > 1:
        problems.append(f"defines {len(facts.memories)} memories; a controller has exactly one")
    for k, m in enumerate(facts.memories):
        where = f"memory {k}"
        if m.shared:
            problems.append(f"{where} is shared (threads); controllers run single-threaded on unshared memory")
        if m.is64:
            problems.append(f"{where} is a 64-bit memory; controllers use 32-bit memory")
        if m.min_bytes > memory_bytes:
            problems.append(f"{where}: initial size {_mib(m.min_bytes)} is over the memory limit of "
                            f"{_mib(memory_bytes)} (Limits.memory_bytes)")
    if len(facts.tables) > 1:
        problems.append(f"defines {len(facts.tables)} tables; a controller may have at most one")
    for k, t in enumerate(facts.tables):
        if t.min_elements > MAX_TABLE_ELEMENTS:
            problems.append(f"table {k}: initial size of {t.min_elements} elements is over the limit of "
                            f"{MAX_TABLE_ELEMENTS}")
    if facts.start is not None:
        problems.append(f"has a start function (function {facts.start}), which would run outside any time "
                        f"limit; initialise in an exported `_initialize` instead (runs under the first-call limit)")
    sizes = [m.min_bytes for m in facts.memories]
    for seg in facts.data:
        if seg.offset is not None and seg.target < len(sizes):
            offset = seg.offset & (0xFFFFFFFF if not facts.memories[seg.target].is64 else (1 << 64) - 1)
            if offset + seg.length > sizes[seg.target]:
                problems.append(f"data segment {seg.index}: bytes [{offset}, {offset + seg.length}) are outside "
                                f"memory {seg.target}'s initial {sizes[seg.target]} bytes")
    for seg in facts.elements:
        if seg.offset is not None and seg.target < len(facts.tables):
            offset, size = seg.offset & 0xFFFFFFFF, facts.tables[seg.target].min_elements
            if offset + seg.length > size:
                problems.append(f"element segment {seg.index}: elements [{offset}, {offset + seg.length}) are "
                                f"outside table {seg.target}'s initial {size} elements")
    return problems


def wasi_problem(name: str, sig: tuple[list[str], list[str]]) -> str | None:
    """Why a `wasi_snapshot_preview1` import cannot be linked, or None."""
    want = WASI_SIGNATURES.get(name)
    where = f"import `wasi_snapshot_preview1`.`{name}`"
    if want is None:
        return f"{where} is not a wasi_snapshot_preview1 function"
    if sig != want:
        return (f"{where} has type ({', '.join(sig[0])}) -> ({', '.join(sig[1])}), expected "
                f"({', '.join(want[0])}) -> ({', '.join(want[1])})")
    return None
