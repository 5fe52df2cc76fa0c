"""A decoder of function bodies that finds instructions whose effect fork cannot copy.

Fork copies linear memory and mutable globals into a fresh instance (docs/protocol.md#implementation). State held
anywhere else diverges between parent and child: table contents changed at run time
(`table.set/grow/fill/copy/init`), dropped segments (`data.drop`, `elem.drop`: the child's
segments are intact again), and GC heap objects. The loader refuses modules that use them.

Every instruction's immediates are decoded (MVP, sign-extension, saturating truncation, bulk
memory, reference types, SIMD and relaxed SIMD, threads, tail calls, exceptions, typed function
references), so an opcode byte is never mistaken for an immediate. Malformed bodies raise
:class:`WasmFormatError`; unknown opcodes are named.
"""
from __future__ import annotations

from .wasm_binary import ModuleFacts, WasmFormatError, Reader, module_facts

# Immediate shapes of the one-byte opcodes.
_NONE, _BLOCK, _IDX, _IDX2, _BR_TABLE, _SELECT_T, _MEMARG, _F32, _F64, _TRY_TABLE = range(10)
_SHAPE: dict[int, int] = {}
for _op in (0x00, 0x01, 0x05, 0x0A, 0x0B, 0x0F, 0x19, 0x1A, 0x1B, 0xD1, 0xD3, 0xD4, *range(0x45, 0xC5)):
    _SHAPE[_op] = _NONE
for _op in (0x02, 0x03, 0x04, 0x06):
    _SHAPE[_op] = _BLOCK
for _op in (0x07, 0x08, 0x09, 0x0C, 0x0D, 0x10, 0x12, 0x14, 0x15, 0x18, *range(0x20, 0x27), 0x3F, 0x40,
            0x41, 0x42, 0xD0, 0xD2, 0xD5, 0xD6):
    _SHAPE[_op] = _IDX          # one LEB128 (index, label, heap type or signed constant)
_SHAPE.update({0x11: _IDX2, 0x13: _IDX2, 0x0E: _BR_TABLE, 0x1C: _SELECT_T, 0x43: _F32, 0x44: _F64, 0x1F: _TRY_TABLE})
for _op in range(0x28, 0x3F):
    _SHAPE[_op] = _MEMARG

_UNSAFE_ONE_BYTE = {0x26: "table.set"}
# 0xFC sub-opcode -> number of LEB immediates; names for the ones fork cannot copy.
_FC_IMMEDIATES = {**{i: 0 for i in range(8)}, 8: 2, 9: 1, 10: 2, 11: 1, 12: 2, 13: 1, 14: 2, 15: 1, 16: 1, 17: 1}
_FC_UNSAFE = {9: "data.drop", 12: "table.init", 13: "elem.drop", 14: "table.copy", 15: "table.grow", 17: "table.fill"}


def leb(r: Reader) -> int:
    return r.leb()


def _memarg(r: Reader) -> None:
    align = r.leb(32)
    if align & 0x40:          # multi-memory: an explicit memory index follows
        r.leb(32)
    r.leb()


def _blocktype(r: Reader) -> None:
    b = r.byte()
    if b in (0x63, 0x64):      # (ref null? heaptype)
        r.leb()
    elif b & 0x80:             # a type index as s33
        while r.byte() & 0x80:
            pass


def _simd(r: Reader, at: int) -> None:
    sub = r.leb(32)
    if sub <= 11 or sub in (92, 93):
        _memarg(r)
    elif sub in (12, 13):
        r.take(16)
    elif 21 <= sub <= 34:
        r.byte()
    elif 84 <= sub <= 91:
        _memarg(r)
        r.byte()
    elif sub > 0x113:
        raise WasmFormatError(f"unknown SIMD instruction 0xfd {sub} at byte {at}")


def _atomic(r: Reader, at: int) -> None:
    sub = r.leb(32)
    if sub == 3:
        r.byte()
    elif sub <= 2 or 0x10 <= sub <= 0x4E:
        _memarg(r)
    else:
        raise WasmFormatError(f"unknown atomic instruction 0xfe {sub} at byte {at}")


def _body_unsafe(r: Reader) -> tuple[str, int] | None:
    """Scan one function body (locals, then instructions up to the body's end)."""
    for _ in range(r.leb(32)):
        r.leb(32)
        if r.byte() in (0x63, 0x64):
            r.leb()
    shape, byte, leb = _SHAPE, r.byte, r.leb
    while r.pos < r.end:
        at = r.pos
        op = byte()
        kind = shape.get(op)
        if kind == _NONE:
            continue
        if kind == _IDX:
            if op in _UNSAFE_ONE_BYTE:
                return _UNSAFE_ONE_BYTE[op], at
            leb()
        elif kind == _MEMARG:
            _memarg(r)
        elif kind == _BLOCK:
            _blocktype(r)
        elif kind == _IDX2:
            leb(), leb()
        elif kind == _BR_TABLE:
            for _ in range(leb(32) + 1):
                leb(32)
        elif kind == _SELECT_T:
            for _ in range(leb(32)):
                if byte() in (0x63, 0x64):
                    leb()
        elif kind == _F32:
            r.take(4)
        elif kind == _F64:
            r.take(8)
        elif kind == _TRY_TABLE:
            _blocktype(r)
            for _ in range(leb(32)):
                if byte() < 2:
                    leb(32)    # tag
                leb(32)        # label
        elif op == 0xFC:
            sub = leb(32)
            if sub in _FC_UNSAFE:
                return _FC_UNSAFE[sub], at
            if sub not in _FC_IMMEDIATES:
                raise WasmFormatError(f"unknown instruction 0xfc {sub} at byte {at}")
            for _ in range(_FC_IMMEDIATES[sub]):
                leb(32)
        elif op == 0xFD:
            _simd(r, at)
        elif op == 0xFE:
            _atomic(r, at)
        elif op == 0xFB:
            return "GC instructions (objects outside linear memory)", at
        else:
            raise WasmFormatError(f"unknown instruction 0x{op:02x} at byte {at}")
    return None


def fork_unsafe_instruction(wasm: bytes, facts: ModuleFacts | None = None) -> str | None:
    """A message naming the first instruction whose effect fork cannot copy, or None."""
    facts = facts or module_facts(wasm)
    if facts.code_section is None:
        return None
    r = Reader(wasm, *facts.code_section)
    n_imported = facts.imported_funcs
    for k in range(r.leb(32)):
        size = r.leb(32)
        body = Reader(wasm, r.pos, r.pos + size)
        if body.end > r.end:
            raise WasmFormatError(f"function body {k} runs past the code section")
        found = _body_unsafe(body)
        if found:
            what, at = found
            return (f"function {n_imported + k} uses `{what}` (at byte {at}); fork copies only linear memory "
                    f"and globals, so a forked copy would diverge from its parent")
        r.pos = body.end
    return None
