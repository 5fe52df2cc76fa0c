"""One sequence: a Store + instance of the controller, the tokens it has seen, its log.

Owned by one thread at a time: the engine's between steps, a worker's during `mid-process`.
"""
from __future__ import annotations

import ctypes
import itertools
from typing import TYPE_CHECKING

import wasmtime
from wasmtime import _ffi as wt_ffi

from . import abi
from .errors import ControllerError
from .host_imports import clear_stale_exception
from .native import get_native, slot_bind, summarize_trap

if TYPE_CHECKING:
    from .request import Request

_ids = itertools.count(1)


def _base(memory: wasmtime.Memory, store) -> int:
    return ctypes.cast(memory.data_ptr(store), ctypes.c_void_p).value or 0


class Sequence:
    """A live controller instance. Made by :meth:`Request.spawn` or by a fork, never directly."""

    def __init__(self, request: "Request") -> None:
        rt = request.runtime
        self.request = request
        self.id = next(_ids)                       # the WIT seq-id
        self.store = wasmtime.Store(rt.engine, data=self.id)
        self._key = wt_ffi.wasmtime_context_get_data(self.store._context())
        self.store.set_limits(memory_size=rt.limits.memory_bytes)
        rt._register(self._key, self)
        self.fault: str | None = None              # set by a host import that trapped the guest
        self.error: str | None = None              # set once the sequence has failed: it is finished
        self.stopped = False
        self.calls = 0
        self.late_steps = 0
        self.in_flight = None                      # (masks, row) of a call not yet collected
        self._close_pending = False
        self.seen: list[int] = []                  # tokens as the controller last saw them
        self.fork_group: list[int] = []            # to report on the next call
        self.log = bytearray()                     # capped history, oldest dropped
        self._call_log = bytearray()
        try:
            pre = rt._instance_pre(request.controller)
            self.instance = pre.instantiate(self.store)
        except Exception as e:  # start function trapped, or memory limit too small
            self.close()
            raise ControllerError(f"instantiating {request.controller.name}: {e}") from None
        ex = self.instance.exports(self.store)
        self.memory: wasmtime.Memory = ex["memory"]
        self.realloc: wasmtime.Func = ex[abi.EXPORT_REALLOC]
        self._globals = {idx: ex[name] for idx, name in request.controller.globals.items()}
        native = get_native()
        self.slot = native.ffi.new("aicirt_slot *")
        slot_bind(native, self.slot, self.store, {
            "f_realloc": self.realloc,
            "f_mid": ex[abi.EXPORT_MID_PROCESS],
            "f_post": ex[abi.EXPORT_POST] if request.controller.has_post else None,
        }, self.memory)
        self.slot.mask_words = rt.mask_words
        self.slot.vocab_size = rt.vocab_size
        self._ffi = native.ffi
        self._tok_buf = native.ffi.new("uint32_t[]", 16)   # argument buffers, reused call to call
        self._group_buf = None
        self.slot.tokens = self._tok_buf
        limits = rt.limits
        self._ticks_first = limits.ticks(limits.first_call_timeout_s)
        self._ticks_call = limits.ticks(limits.call_timeout_s)
        self._initialize_export = ex[abi.EXPORT_INITIALIZE] if request.controller.has_initialize else None

    @classmethod
    def instantiate(cls, request: "Request") -> "Sequence":
        seq = cls(request)
        if seq._initialize_export is not None:
            seq.store.set_epoch_deadline(seq._ticks_first)
            try:
                seq._initialize_export(seq.store)
            except Exception as e:
                clear_stale_exception()
                msg = seq.fault or summarize_trap(str(e))
                seq.close()
                raise ControllerError(f"_initialize of {request.controller.name} failed: {msg}") from None
        return seq

    # -- fork ---------------------------------------------------------------------------------
    def fork(self) -> "Sequence":
        """A new sequence whose controller is a copy of this one's: linear memory and every
        mutable global (the module was rewritten at load time to export them)."""
        child = Sequence(self.request)
        try:
            grow = self.memory.size(self.store) - child.memory.size(child.store)
            if grow > 0:
                child.memory.grow(child.store, grow)
            n = self.memory.data_len(self.store)
            ctypes.memmove(_base(child.memory, child.store), _base(self.memory, self.store), n)
            # Raw value copies: the globals are numeric (the rewriter refuses others), and
            # wasmtime-py's Global.value/set_value cost ~10 µs each through Val objects.
            raw = wt_ffi.wasmtime_val_t()
            for idx, g in self._globals.items():
                wt_ffi.wasmtime_global_get(self.store._context(), ctypes.byref(g._global), ctypes.byref(raw))
                err = wt_ffi.wasmtime_global_set(child.store._context(), ctypes.byref(child._globals[idx]._global),
                                                 ctypes.byref(raw))
                if err:
                    raise wasmtime.WasmtimeError._from_ptr(err)
        except Exception as e:
            child.close()
            raise ControllerError(f"fork failed: {e}") from None
        child.seen = list(self.seen)
        child.calls = self.calls
        self.request.sequences.append(child)
        return child

    # -- per call ------------------------------------------------------------------------------
    def prepare(self, tokens, sampled: int | None, mask_row_addr, unchanged: int | None = None) -> None:
        """Fill the slot's arguments with the net edit from what the controller saw to `tokens`.

        `unchanged`: the caller's promise that `tokens[:unchanged]` is what it passed last time;
        the comparison then starts there (O(edit) instead of O(length)). Raises ValueError
        (changing nothing) for a token that is not an id of the vocabulary or a bad `unchanged`.
        """
        seen = self.seen
        n = len(seen)
        if unchanged is not None:
            if not (isinstance(unchanged, int) and 0 <= unchanged <= len(tokens)):
                raise ValueError(f"unchanged={unchanged!r} is not a prefix length of the {len(tokens)} tokens")
            cp, limit = min(unchanged, n), min(n, len(tokens))
            while cp < limit and seen[cp] == tokens[cp]:
                cp += 1
        elif len(tokens) >= n and tokens[:n] == seen:
            cp = n
        else:
            cp = 0
            for cp, (a, b) in enumerate(zip(seen, tokens)):  # noqa: B007
                if a != b:
                    break
            else:
                cp = min(n, len(tokens))
        new = tokens[cp:]
        vocab = self.slot.vocab_size
        for t in new if sampled is None else (*new, sampled):
            if not (isinstance(t, int) and 0 <= t < vocab):   # checked before anything changes
                raise ValueError(f"token {t!r} is not a token id of this vocabulary (0..{vocab - 1})")
        del seen[cp:]
        seen.extend(new)
        s = self.slot
        s.backtrack = n - cp
        s.n_tokens = len(new)
        if new:
            if len(new) > len(self._tok_buf):
                self._tok_buf = self._ffi.new("uint32_t[]", max(len(new), 2 * len(self._tok_buf)))
                s.tokens = self._tok_buf
            self._tok_buf[0:len(new)] = new
        s.sampled_is_some = sampled is not None
        s.sampled = sampled or 0
        if self.fork_group:
            self._group_buf = self._ffi.new("uint32_t[]", self.fork_group)
            s.group = self._group_buf
            s.n_group = len(self.fork_group)
            self.fork_group = []
        else:
            s.n_group = 0
        s.mask_row = mask_row_addr
        s.deadline_ticks = self._ticks_call if self.calls else self._ticks_first
        s.done = 0
        self.fault = None
        self.calls += 1

    def append_log(self, data: bytes) -> None:
        cap = self.request.runtime.limits.log_bytes
        for buf in (self.log, self._call_log):
            buf += data
            if len(buf) > cap:
                del buf[: len(buf) - cap]

    def take_call_log(self) -> str:
        text = self._call_log.decode("utf-8", "replace")
        self._call_log.clear()
        return text

    @property
    def finished(self) -> bool:
        return self.stopped or self.error is not None

    def close(self) -> None:
        """Free the instance and its Store. Idempotent. While a call is still running on a
        worker, the sequence is marked finished and freed once the call ends."""
        if self.in_flight is not None and self.slot is not None and not self.slot.done:
            self._close_pending = True
            if self.error is None:
                self.stopped = True
            self.request.runtime._defer_close(self)
            return
        store = self.__dict__.pop("store", None)
        if store is None:
            return
        self.request.runtime._unregister(self._key)
        self.instance = self.memory = self.realloc = None
        self._globals = {}
        self.slot = None
        store.close()
