"""Turning what a failed call left in a slot (a wasm trap, a wasmtime error) into one line."""
from __future__ import annotations

_TRAP_CODE_INTERRUPT = 10   # WASMTIME_TRAP_CODE_INTERRUPT: the epoch deadline passed


def summarize_trap(text: str, frames: int = 4) -> str:
    """wasmtime's trap text in one line: the cause, then where (innermost function first)."""
    cause = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), text)
    cause = cause.removeprefix("wasm trap: ")
    names: list[str] = []
    for ln in text.splitlines():
        if "!" in ln and ln.lstrip()[:1].isdigit():
            name = ln.rsplit("!", 1)[1].strip()
            if not names or names[-1] != name:
                names.append(name)
    where = " <- ".join(names[:frames]) + (" <- ..." if len(names) > frames else "")
    return f"{cause} (in {where})" if names else cause


def take_error_text(wt, wtlib, trap_addr: int, err_addr: int) -> str:
    """Format and free a trap and/or a wasmtime error (addresses; 0 for none)."""
    parts = []
    if trap_addr:
        trap = wt.cast("wasm_trap_t *", trap_addr)
        code = wt.new("uint8_t *")
        is_code = wtlib.wasmtime_trap_code(trap, code)
        msg = wt.new("wasm_byte_vec_t *")
        wtlib.wasm_trap_message(trap, msg)
        text = wt.string(msg.data, msg.size).decode("utf-8", "replace").rstrip("\0")
        wtlib.wasm_byte_vec_delete(msg)
        wtlib.wasm_trap_delete(trap)
        if is_code and code[0] == _TRAP_CODE_INTERRUPT:
            text = "interrupted: exceeded the time limit for one call"
        parts.append(f"trap: {summarize_trap(text)}")
    if err_addr:
        err = wt.cast("wasmtime_error_t *", err_addr)
        msg = wt.new("wasm_byte_vec_t *")
        wtlib.wasmtime_error_message(err, msg)
        parts.append(wt.string(msg.data, msg.size).decode("utf-8", "replace"))
        wtlib.wasm_byte_vec_delete(msg)
        wtlib.wasmtime_error_delete(err)
    return "; ".join(parts) or "unknown failure"
