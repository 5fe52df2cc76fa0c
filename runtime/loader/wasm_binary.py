"""Just enough of the core Wasm binary format to rewrite a controller before it is compiled.

Fork copies a parent's linear memory *and every mutable global* into a fresh instance. Globals
that the module does not export (wasi-libc's `__stack_pointer`, say) are invisible from the host,
so at load time we append an export for each such global, named ``aicirt-global-<index>``.
Nothing else in the module changes. (:func:`snapshot_module` writes the other rewrite, an init
snapshot: see :mod:`aicirt.loader.snapshot`.) Every read is bounds-checked: malformed input raises
:class:`WasmFormatError`, never an IndexError or a hang.
"""
from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

MAGIC = b"\0asm\x01\0\0\0"
GLOBAL_EXPORT_PREFIX = "aicirt-global-"

_SEC_IMPORT, _SEC_TABLE, _SEC_MEMORY, _SEC_GLOBAL, _SEC_EXPORT = 2, 4, 5, 6, 7
_SEC_START, _SEC_ELEMENT, _SEC_CODE, _SEC_DATA = 8, 9, 10, 11
# Canonical section order (ids); custom sections (0) may sit anywhere. Tag (13) sits between
# memory (5) and global (6); data count (12) between element (9) and code (10).
_ORDER = [1, 2, 3, 4, 5, 13, 6, 7, 8, 9, 12, 10, 11]
_NUMERIC_VALTYPES = {0x7F: "i32", 0x7E: "i64", 0x7D: "f32", 0x7C: "f64"}


class WasmFormatError(ValueError):
    """The bytes are not a well-formed core Wasm module (as far as the rewriter reads them)."""


@dataclass(frozen=True)
class GlobalInfo:
    index: int          # in the global index space (imports first)
    valtype: int        # raw valtype byte
    mutable: bool
    imported: bool


class Reader:
    """A cursor over a Wasm binary's bytes (`data[pos:end]`): LEB128 integers, names, bytes;
    reading past `end` raises :class:`WasmFormatError`. Public: the other readers (code bodies,
    recipes, bound scripts) share it."""

    def __init__(self, data: bytes, pos: int = 0, end: int | None = None):
        self.data, self.pos = data, pos
        self.end = len(data) if end is None else end

    def byte(self) -> int:
        if self.pos >= self.end:
            raise WasmFormatError(f"unexpected end of module at byte {self.pos}")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self.end:
            raise WasmFormatError(f"length {n} at byte {self.pos} runs past the end")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def leb(self, max_bits: int = 64, signed: bool = False) -> int:
        result = shift = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return result - (1 << shift) if signed and b & 0x40 else result
            if shift >= max_bits + 7:
                raise WasmFormatError(f"LEB128 too long at byte {self.pos}")

    def name(self) -> str:
        raw = self.take(self.leb(32))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise WasmFormatError(f"name is not UTF-8 at byte {self.pos}") from e


def leb(n: int) -> bytes:
    """`n` (unsigned) as LEB128."""
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def name_bytes(s: str) -> bytes:
    """A Wasm name: its UTF-8 length as LEB128, then the bytes."""
    raw = s.encode()
    return leb(len(raw)) + raw


def sections(wasm: bytes) -> list[tuple[int, int, int, int]]:
    """(id, header start, payload start, payload end) of every section, in order."""
    if wasm[:8] != MAGIC:
        raise WasmFormatError("not a core Wasm module (bad magic or version; components are not accepted)")
    r = Reader(wasm, 8)
    out = []
    while r.pos < r.end:
        header = r.pos
        sid = r.byte()
        if sid != 0 and sid not in _ORDER:
            raise WasmFormatError(f"unknown section id {sid} at byte {header}")
        size = r.leb(32)
        start = r.pos
        r.take(size)
        out.append((sid, header, start, start + size))
    return out


def _skip_valtype(r: Reader) -> int:
    t = r.byte()
    if t in (0x63, 0x64):  # (ref null? ht)
        r.leb()
    return t


def _skip_const_expr(r: Reader) -> None:
    while True:
        op = r.byte()
        if op == 0x0B:
            return
        if op in (0x41, 0x42, 0x23, 0xD2):
            r.leb()
        elif op == 0x43:
            r.take(4)
        elif op == 0x44:
            r.take(8)
        elif op == 0xD0:
            r.leb()
        elif op == 0xFD:
            if r.leb(32) != 12:
                raise WasmFormatError("unsupported SIMD instruction in a constant expression")
            r.take(16)
        elif op in (0x6A, 0x6B, 0x6C, 0x7C, 0x7D, 0x7E):
            pass
        else:
            raise WasmFormatError(f"unsupported opcode 0x{op:02x} in a constant expression")


def globals_and_exports(wasm: bytes) -> tuple[list[GlobalInfo], dict[str, tuple[int, int]]]:
    """All globals (imported first) and all exports as name -> (kind, index)."""
    globals_: list[GlobalInfo] = []
    exports: dict[str, tuple[int, int]] = {}
    for sid, _, start, end in sections(wasm):
        r = Reader(wasm, start, end)
        if sid == _SEC_IMPORT:
            for kind, info in _imports(r):
                if kind == 3:
                    globals_.append(GlobalInfo(len(globals_), info[0], info[1], True))
        elif sid == _SEC_GLOBAL:
            for _ in range(r.leb(32)):
                t = _skip_valtype(r)
                mut = r.byte() == 1
                _skip_const_expr(r)
                globals_.append(GlobalInfo(len(globals_), t, mut, False))
        elif sid == _SEC_EXPORT:
            for _ in range(r.leb(32)):
                name = r.name()
                kind = r.byte()
                exports[name] = (kind, r.leb(32))
    return globals_, exports


def export_mutable_globals(wasm: bytes) -> tuple[bytes, dict[int, str]]:
    """Return the module with every defined mutable global exported, and index -> export name.

    Raises :class:`WasmFormatError` for a malformed module and for a mutable global whose type
    cannot be copied between instances (reference types).
    """
    globals_, exports = globals_and_exports(wasm)
    exported = {idx: name for name, (kind, idx) in exports.items() if kind == 3}
    names: dict[int, str] = {}
    added: list[bytes] = []
    for g in globals_:
        if not g.mutable:
            continue
        if g.valtype not in _NUMERIC_VALTYPES:
            raise WasmFormatError(f"mutable global {g.index} has a reference type; fork cannot copy it")
        if g.index in exported:
            names[g.index] = exported[g.index]
        else:
            name = f"{GLOBAL_EXPORT_PREFIX}{g.index}"
            names[g.index] = name
            added.append(name_bytes(name) + b"\x03" + leb(g.index))
    if not added:
        return wasm, names
    return _with_extra_exports(wasm, added, len(exports)), names


def _with_extra_exports(wasm: bytes, added: list[bytes], n_existing: int) -> bytes:
    secs = sections(wasm)
    out = bytearray(MAGIC)
    placed = False
    for sid, header, start, end in secs:
        if sid == _SEC_EXPORT:
            r = Reader(wasm, start, end)
            r.leb(32)  # count; the entries follow unchanged
            payload = leb(n_existing + len(added)) + wasm[r.pos:end] + b"".join(added)
            out += bytes([_SEC_EXPORT]) + leb(len(payload)) + payload
            placed = True
            continue
        if not placed and sid != 0 and _ORDER.index(sid) > _ORDER.index(_SEC_EXPORT):
            payload = leb(len(added)) + b"".join(added)
            out += bytes([_SEC_EXPORT]) + leb(len(payload)) + payload
            placed = True
        out += wasm[header:end]
    if not placed:
        payload = leb(len(added)) + b"".join(added)
        out += bytes([_SEC_EXPORT]) + leb(len(payload)) + payload
    return bytes(out)


# -- what instantiation will need: memories, tables, start, segments --------------------------
WASM_PAGE = 65536


@dataclass(frozen=True)
class MemoryInfo:
    min_bytes: int
    max_bytes: int | None
    shared: bool
    is64: bool
    imported: bool


@dataclass(frozen=True)
class TableInfo:
    min_elements: int
    max_elements: int | None
    imported: bool


@dataclass(frozen=True)
class SegmentInfo:
    """An active data or element segment: where it lands (None: not a constant we can evaluate)."""
    index: int
    target: int          # memory or table index
    offset: int | None
    length: int          # bytes (data) or elements (element)


@dataclass
class ModuleFacts:
    memories: list[MemoryInfo]
    tables: list[TableInfo]
    start: int | None
    data: list[SegmentInfo]
    elements: list[SegmentInfo]
    code_section: tuple[int, int] | None    # payload [start, end) of the code section
    imported_funcs: int = 0


def _limits(r: Reader, memory: bool) -> tuple[int, int | None, bool, bool]:
    """(min, max, shared, is64) with min/max in pages (memories, after custom page sizes: bytes) or elements."""
    flags = r.byte()
    if flags & ~0x0F:
        raise WasmFormatError(f"bad limits flags 0x{flags:02x} at byte {r.pos - 1}")
    lo = r.leb()
    hi = r.leb() if flags & 1 else None
    page = WASM_PAGE
    if flags & 8:
        page = 1 << r.leb(32)
    if memory:
        lo, hi = lo * page, (hi * page if hi is not None else None)
    return lo, hi, bool(flags & 2), bool(flags & 4)


def _const_value(r: Reader, globals_init: list[int | None]) -> int | None:
    """Evaluate an integer constant expression (i32/i64 const, global.get, extended-const
    add/sub/mul); None if it uses anything else (then instantiation decides)."""
    stack: list[int | None] = []
    while True:
        op = r.byte()
        if op == 0x0B:
            return stack[-1] if len(stack) == 1 else None
        if op in (0x41, 0x42):
            stack.append(r.leb(signed=True))
        elif op == 0x23:
            g = r.leb(32)
            stack.append(globals_init[g] if g < len(globals_init) else None)
        elif op in (0x6A, 0x6B, 0x6C, 0x7C, 0x7D, 0x7E) and len(stack) >= 2:
            b, a = stack.pop(), stack.pop()
            if a is None or b is None:
                stack.append(None)
            else:
                stack.append(a + b if op in (0x6A, 0x7C) else a - b if op in (0x6B, 0x7D) else a * b)
        else:
            r.pos -= 1
            _skip_const_expr(r)
            return None


def _skip_reftype(r: Reader) -> None:
    if r.byte() in (0x63, 0x64):
        r.leb(signed=True)


def _imports(r: Reader) -> Iterator[tuple[int, Any]]:
    """(kind, what) for each entry of an import section: limits for tables (1) and memories
    (2), (valtype, mutable) for globals (3), None for functions (0) and tags (4)."""
    for _ in range(r.leb(32)):
        r.name(), r.name()
        kind = r.byte()
        if kind in (0, 4):
            if kind == 4:
                r.byte()
            r.leb()
            yield kind, None
        elif kind in (1, 2):
            if kind == 1:
                _skip_reftype(r)
            yield kind, _limits(r, kind == 2)
        elif kind == 3:
            t = _skip_valtype(r)
            yield kind, (t, r.byte() == 1)
        else:
            raise WasmFormatError(f"unknown import kind {kind}")


def module_facts(wasm: bytes) -> ModuleFacts:
    """Memories, tables, start function and active segments: what the loader checks against
    the sandbox limits before compiling (instantiation would refuse them later, and worse)."""
    facts = ModuleFacts([], [], None, [], [], None)
    globals_init: list[int | None] = []
    info: tuple[int, int | None, bool, bool]   # limits: the only import info read here
    for sid, _, start, end in sections(wasm):
        r = Reader(wasm, start, end)
        if sid == _SEC_IMPORT:
            for kind, info in _imports(r):
                if kind == 0:
                    facts.imported_funcs += 1
                elif kind == 1:
                    facts.tables.append(TableInfo(info[0], info[1], True))
                elif kind == 2:
                    facts.memories.append(MemoryInfo(*info, True))
                elif kind == 3:
                    globals_init.append(None)
        elif sid == _SEC_TABLE:
            for _ in range(r.leb(32)):
                with_init = r.data[r.pos] == 0x40 if r.pos < r.end else False
                if with_init:
                    r.take(2)
                _skip_reftype(r)
                lo, hi, _, _ = _limits(r, False)
                if with_init:
                    _skip_const_expr(r)
                facts.tables.append(TableInfo(lo, hi, False))
        elif sid == _SEC_MEMORY:
            for _ in range(r.leb(32)):
                lo, hi, shared, is64 = _limits(r, True)
                facts.memories.append(MemoryInfo(lo, hi, shared, is64, False))
        elif sid == _SEC_GLOBAL:
            for _ in range(r.leb(32)):
                _skip_valtype(r)
                mutable = r.byte() == 1
                value = _const_value(r, globals_init)
                globals_init.append(None if mutable else value)
        elif sid == _SEC_START:
            facts.start = r.leb(32)
        elif sid == _SEC_ELEMENT:
            facts.elements = _element_segments(r, globals_init)
        elif sid == _SEC_CODE:
            facts.code_section = (start, end)
        elif sid == _SEC_DATA:
            for k in range(r.leb(32)):
                flags = r.leb(32)
                if flags == 1:
                    r.take(r.leb(32))
                    continue
                if flags not in (0, 2):
                    raise WasmFormatError(f"data segment {k}: unknown flags {flags}")
                mem = r.leb(32) if flags == 2 else 0
                offset = _const_value(r, globals_init)
                n = r.leb(32)
                r.take(n)
                facts.data.append(SegmentInfo(k, mem, offset, n))
    return facts


def _element_segments(r: Reader, globals_init: list[int | None]) -> list[SegmentInfo]:
    out = []
    for k in range(r.leb(32)):
        flags = r.leb(32)
        if flags > 7:
            raise WasmFormatError(f"element segment {k}: unknown flags {flags}")
        active = not flags & 1
        table = r.leb(32) if flags & 3 == 2 else 0
        offset = _const_value(r, globals_init) if active else None
        if flags & 3:                      # an element kind or a reference type follows
            if flags & 4:
                _skip_reftype(r)
            else:
                r.byte()
        n = r.leb(32)
        for _ in range(n):
            if flags & 4:
                _skip_const_expr(r)
            else:
                r.leb(32)
        if active:
            out.append(SegmentInfo(k, table, offset, n))
    return out


# -- init snapshots: the module whose instances start where an instance's init left off ---------
def _sleb(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if (n == 0 and not b & 0x40) or (n == -1 and b & 0x40):
            out.append(b)
            return bytes(out)
        out.append(b | 0x80)


def _const(valtype: int, value: int | float) -> bytes:
    """A constant expression for a global's value (i32/i64 signed, f32/f64 IEEE)."""
    if valtype == 0x7F:
        v = int(value) & 0xFFFFFFFF
        return b"\x41" + _sleb(v - (1 << 32) if v >= 1 << 31 else v) + b"\x0b"
    if valtype == 0x7E:
        v = int(value) & 0xFFFFFFFFFFFFFFFF
        return b"\x42" + _sleb(v - (1 << 64) if v >= 1 << 63 else v) + b"\x0b"
    if valtype == 0x7D:
        return b"\x43" + struct.pack("<f", value) + b"\x0b"
    return b"\x44" + struct.pack("<d", value) + b"\x0b"


def memory_runs(memory: bytes, page: int = WASM_PAGE) -> list[tuple[int, bytes]]:
    """(offset, bytes) of the runs of `page`-sized blocks that hold a non-zero byte: the data
    segments of a snapshot. Zero blocks are left out (fresh memory is zero); whole blocks are
    kept, so the segments stay dense and wasmtime maps them as one copy-on-write image."""
    runs: list[tuple[int, bytes]] = []
    start = None
    zero = bytes(page)
    for off in range(0, len(memory), page):
        used = memory[off:off + page] != zero[:len(memory) - off]
        if used and start is None:
            start = off
        elif not used and start is not None:
            runs.append((start, memory[start:off]))
            start = None
    if start is not None:
        runs.append((start, memory[start:]))
    return runs


def snapshot_module(wasm: bytes, memory: bytes | int, globals_now: dict[int, int | float],
                    drop_exports: set[str], *, runs: list[tuple[int, bytes]] | None = None) -> bytes:
    """`wasm` rewritten so that a fresh instance holds `memory` and the mutable globals'
    `globals_now` (index -> value) at start: the memory's minimum grown to `len(memory)` (a
    multiple of 64 KiB), every active data segment emptied (its index kept, for `memory.init` of
    the passive ones) and the memory's non-zero blocks appended as active segments, each mutable
    global's initializer replaced, the start function and the exports in `drop_exports` (the init
    functions already run) removed. Tables, code and everything else are unchanged. With `runs`
    ((offset, bytes), ascending, not overlapping: the memory's contents, zeros elsewhere),
    `memory` is only the memory's size in bytes (snapshot.py passes the init's written bytes).

    Raises :class:`WasmFormatError` for a malformed module and for one this cannot snapshot:
    not exactly one defined 32-bit memory with 64 KiB pages, or a mutable global left out of
    `globals_now`."""
    size = memory if isinstance(memory, int) else len(memory)
    if size % WASM_PAGE:
        raise WasmFormatError(f"a snapshot's memory is whole 64 KiB pages, not {size} bytes")
    globals_, _ = globals_and_exports(wasm)
    n_imported_globals = sum(g.imported for g in globals_)
    missing = [g.index for g in globals_ if g.mutable and not g.imported and g.index not in globals_now]
    if missing:
        raise WasmFormatError(f"no snapshot value for mutable global {missing[0]}")
    facts = module_facts(wasm)
    if len(facts.memories) != 1 or facts.memories[0].imported or facts.memories[0].is64:
        raise WasmFormatError("a snapshot needs exactly one defined 32-bit memory")
    if runs is None:
        if isinstance(memory, int):
            raise TypeError("snapshot_module: a memory given by its size needs its runs")
        runs = memory_runs(memory)
    elif runs and runs[-1][0] + len(runs[-1][1]) > size:
        raise WasmFormatError("a snapshot's data runs past its memory")
    out = bytearray(MAGIC)

    def emit(sid: int, payload: bytes) -> None:
        out.extend(bytes([sid]) + leb(len(payload)) + payload)

    had_data = False
    for sid, header, start, end in sections(wasm):
        r = Reader(wasm, start, end)
        if sid == _SEC_MEMORY:
            r.leb(32)
            flags = r.byte()
            if flags & ~0x03:
                raise WasmFormatError("a snapshot needs a memory with 64 KiB pages")
            old_min = r.leb()
            max_pages = r.leb() if flags & 1 else None
            pages = max(old_min, size // WASM_PAGE)
            if max_pages is not None and pages > max_pages:
                raise WasmFormatError(f"the snapshot's {pages} pages are over the memory's maximum of {max_pages}")
            emit(sid, leb(1) + bytes([flags]) + leb(pages) + (leb(max_pages) if max_pages is not None else b""))
        elif sid == _SEC_GLOBAL:
            n = r.leb(32)
            payload = bytearray(leb(n))
            for k in range(n):
                t_at = r.pos
                t = _skip_valtype(r)
                mut = r.byte() == 1
                e_at = r.pos
                _skip_const_expr(r)
                index = n_imported_globals + k
                payload += wasm[t_at:e_at]
                payload += _const(t, globals_now[index]) if mut else wasm[e_at:r.pos]
            emit(sid, bytes(payload))
        elif sid == _SEC_EXPORT:
            kept = []
            for _ in range(r.leb(32)):
                at = r.pos
                name = r.name()
                r.byte(), r.leb(32)
                if name not in drop_exports:
                    kept.append(wasm[at:r.pos])
            emit(sid, leb(len(kept)) + b"".join(kept))
        elif sid == _SEC_START:
            continue
        elif sid == 12:       # data count: the segments we keep plus the snapshot's
            emit(sid, leb(r.leb(32) + len(runs)))
        elif sid == _SEC_DATA:
            had_data = True
            emit(sid, _snapshot_data(r, runs))
        else:
            out.extend(wasm[header:end])
    if not had_data and runs:
        emit(_SEC_DATA, leb(len(runs)) + b"".join(_active(off, data) for off, data in runs))
    return bytes(out)


def _active(offset: int, data: bytes) -> bytes:
    return b"\x00" + _const(0x7F, offset) + leb(len(data)) + data


def _snapshot_data(r: Reader, runs: list[tuple[int, bytes]]) -> bytes:
    """The data section: passive segments as they were, active ones emptied (the snapshot holds
    what they wrote, and what the program wrote over it since), then the snapshot's runs."""
    n = r.leb(32)
    parts = [leb(n + len(runs))]
    for k in range(n):
        at = r.pos
        flags = r.leb(32)
        if flags == 1:
            r.take(r.leb(32))
            parts.append(r.data[at:r.pos])
            continue
        if flags not in (0, 2):
            raise WasmFormatError(f"data segment {k}: unknown flags {flags}")
        if flags == 2 and r.leb(32) != 0:
            raise WasmFormatError(f"data segment {k} is for a second memory")
        _skip_const_expr(r)
        r.take(r.leb(32))
        parts.append(_active(0, b""))
    parts += [_active(off, data) for off, data in runs]
    return b"".join(parts)
