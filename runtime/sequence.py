"""One sequence: a Store + instance of the controller, the tokens it has seen, its state.

A sequence's state has one owner, this class: the batch asks for transitions (start a call,
mark it late, collect it, finish) and never writes the fields itself. While a call runs the
sequence belongs to a worker thread; between calls to the engine's thread.

    IDLE --start--> RUNNING --collect--> IDLE        (or FINISHED: stop / error)
                    RUNNING --late-----> LATE --collect--> IDLE
    IDLE | FINISHED --close--> CLOSED
    RUNNING | LATE  --close--> CLOSING --(its call ends)--> CLOSED

A call that is given up on (late too many steps in a row) leaves the sequence FINISHED with the
call still out on its worker: closing it is then CLOSING too, until the call ends.
"""
from __future__ import annotations

import enum
import itertools
import weakref
from typing import TYPE_CHECKING

import wasmtime

from .errors import ControllerError
from .native import instance
from .native.types import CData
from .owned import Owned

if TYPE_CHECKING:
    import numpy as np

    from .request import Request
    from .results import StepInput

_ids = itertools.count(1)


class SeqState(enum.Enum):
    IDLE = "idle"            # ready for a call
    RUNNING = "running"      # a call submitted in a batch not yet waited for
    LATE = "late"            # a call that missed its step's deadline; collected by a later step
    FINISHED = "finished"    # stopped or failed (`error`); no more calls
    CLOSING = "closing"      # closed while its call runs: freed when the call ends
    CLOSED = "closed"


class Sequence(Owned):
    """A live controller instance. Made by :meth:`Request.spawn` or by a fork, never directly.

    `id` is the WIT seq-id; `state` a :class:`SeqState`; `error` says why it failed (then
    `finished`); `log` is its controller log (the last Limits.log_bytes bytes).
    """

    def __init__(self, request: "Request") -> None:
        rt = request.runtime
        native = rt.native
        self.request = request
        self.runtime = rt
        self.id = next(_ids)
        self.state = SeqState.IDLE
        self.error: str | None = None
        self.calls = 0
        self.late_steps = 0
        self.mask_buffer: tuple | None = None      # (batch mask array, row) a call out writes into; None: no call out
        self.seen: list[int] = []                  # tokens as the controller last saw them
        self.fork_group: list[int] = []            # to report on the next call
        self._native = native
        limits = rt.limits
        self._ticks_first = limits.ticks(limits.first_call_timeout_s)
        self._ticks_call = limits.ticks(limits.call_timeout_s)
        self._first_s, self._call_s = limits.first_call_timeout_s, limits.call_timeout_s
        slot = self.slot = native.new_slot()
        # the slot's native buffers (its log) are freed once, at close or when collected unclosed
        self._release_slot = weakref.finalize(self, native.release, slot)
        slot.seq_id = self.id
        slot.vocab_size = rt.vocab_size
        slot.mask_words = rt.mask_words
        slot.eos_token = rt.eos_token
        slot.capabilities = int(request.capabilities)
        slot.host_arg_cap = limits.host_arg_bytes
        slot.arg, slot.arg_len = request.arg_buffer, len(request.arg)
        slot.vars = native.ffi.NULL if request.vars.ptr is None else request.vars.ptr
        slot.log_cap = limits.log_bytes
        slot.first_call_ticks = self._ticks_first
        slot.tick_us = limits.epoch_tick_s * 1e6
        self._tok_buf = native.ffi.new("uint32_t[]", 16)   # argument buffers, reused call to call
        self._group_buf = None
        slot.tokens = self._tok_buf
        self.store: wasmtime.Store | None = wasmtime.Store(rt.engine)
        self.store.set_limits(memory_size=limits.memory_bytes)
        self.store.set_epoch_deadline(self._ticks_first)   # a start function runs under the first-call limit
        instance.bind(native, slot, self.store)
        rt._register(self)
        resident = rt.resident
        try:
            self.instance: wasmtime.Instance | None
            with resident.lock:   # a slot is taken and recorded as taken at once (resident.py)
                self.instance, memory, self._globals = instance.instantiate(
                    native, slot, rt._instance_pre(request.controller), self.store, request.controller)
                resident.taken(instance.memory_base(memory, self.store))
        except Exception as e:  # start function trapped, or memory limit too small
            self._free()
            raise ControllerError(f"instantiating {request.controller.name}: {e}") from None
        self.memory: wasmtime.Memory | None = memory

    def _describe(self) -> str:
        return f"sequence {self.id}"

    @classmethod
    def instantiate(cls, request: "Request") -> "Sequence":
        """A fresh instance. Its `_initialize`, if any, runs on a worker before its first call
        (under the first-call limit), so that it never holds up the engine's thread."""
        return cls(request)

    # -- what the batch may ask ----------------------------------------------------------------
    @property
    def finished(self) -> bool:
        """Stopped, failed or closed: no more calls."""
        return self.state in (SeqState.FINISHED, SeqState.CLOSING, SeqState.CLOSED)

    @property
    def call_out(self) -> bool:
        """A call was started and not yet collected (it may still be running)."""
        return self.mask_buffer is not None

    def _start(self, item: "StepInput", mask_row: CData, mask_buffer: tuple[np.ndarray, int]) -> None:
        """IDLE -> RUNNING: fill the slot with the net edit from what the controller saw to
        `item.tokens`. Raises ValueError, changing nothing, for a token that is not an id of the
        vocabulary or a bad `unchanged` hint (the caller then fails this sequence)."""
        tokens, sampled, unchanged = item.tokens, item.sampled, item.unchanged
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
                self._tok_buf = self._native.ffi.new("uint32_t[]", max(len(new), 2 * len(self._tok_buf)))
                s.tokens = self._tok_buf
            self._tok_buf[0:len(new)] = new
        s.sampled_is_some = sampled is not None
        s.sampled = sampled or 0
        if self.fork_group:
            self._group_buf = self._native.ffi.new("uint32_t[]", self.fork_group)
            s.group = self._group_buf
            s.n_group = len(self.fork_group)
            self.fork_group = []
        else:
            s.n_group = 0
        s.mask_row = mask_row
        s.deadline_ticks = self._ticks_call if self.calls else self._ticks_first
        s.budget_us = (self._call_s if self.calls else self._first_s) * 1e6
        s.done = 0
        self.calls += 1
        self.mask_buffer = mask_buffer
        self.state = SeqState.RUNNING
        self.runtime._call_started(self)

    def _mark_late(self, counts: bool = True) -> int:
        """RUNNING|LATE -> LATE (the call missed another deadline); returns the steps late in a
        row (`counts`: whether this step is charged to the controller)."""
        if self.state is not SeqState.CLOSING:
            self.state = SeqState.LATE
        self.late_steps += counts
        return self.late_steps

    def _collected(self) -> None:
        """The call's result was taken: back to IDLE, or freed if it was closed meanwhile."""
        self.mask_buffer = None
        self.late_steps = 0
        self.runtime._call_collected(self)
        if self.state is SeqState.CLOSING:
            self._free()
        elif self.state in (SeqState.RUNNING, SeqState.LATE):
            self.state = SeqState.IDLE

    def _finish(self, error: str | None = None) -> None:
        """-> FINISHED (stopped, or failed with `error`); a closing sequence stays closing."""
        if error is not None and self.error is None:
            self.error = error
        if self.state in (SeqState.IDLE, SeqState.RUNNING, SeqState.LATE):
            self.state = SeqState.FINISHED

    # -- fork -------------------------------------------------------------------------------------
    def fork(self) -> "Sequence":
        """A copy of this sequence's controller state as a new sequence of the same request (what
        a fork result does; useful to run alternatives from one compiled state). Raises
        ValueError unless the sequence is idle, ControllerError if the copy cannot be made."""
        if self.state is not SeqState.IDLE:
            raise ValueError(f"{self._describe()} is {self.state.value}: only an idle sequence can be forked")
        return self._fork(1)[0]

    def _fork(self, n: int) -> list["Sequence"]:
        """`n` new sequences whose controllers are copies of this one's (linear memory and every
        mutable global); all of the group get `fork_group` for their next call. Raises
        ControllerError (closing any child made) if a copy cannot be made."""
        children: list[Sequence] = []
        try:
            for _ in range(n):
                child = Sequence(self.request)
                children.append(child)
                assert self.store and self.memory and child.store and child.memory   # all open here
                instance.copy_state(self._native, self.request.controller, self.store, self.memory, self._globals,
                                    child.store, child.memory, child._globals)
                child.seen = list(self.seen)
                child.calls = self.calls
                child.slot.needs_init = self.slot.needs_init   # the copied state has run _initialize if the parent's had
                self._native.copy_pending_post(self.slot, child.slot)
        except Exception as e:
            for child in children:
                child.close()
            raise ControllerError(f"fork failed: {e}") from None
        self.request._adopt(children)
        group = [self.id] + [c.id for c in children]
        for member in (self, *children):
            member.fork_group = group
        return children

    # -- log -------------------------------------------------------------------------------------
    @property
    def log(self) -> bytes:
        """The controller's log (the last Limits.log_bytes bytes; kept after close)."""
        return self._native.log_bytes(self.slot) if self.state is not SeqState.CLOSED else self._final_log

    def _take_call_log(self) -> str:
        return self._native.take_call_log(self.slot).decode("utf-8", "replace")

    # -- lifetime ----------------------------------------------------------------------------------
    def _release(self) -> None:
        """Free the instance and its Store; while a call is still out, once it ends."""
        if self.call_out and self.state is not SeqState.CLOSING:
            self.state = SeqState.CLOSING
            self.runtime._closing(self)
        elif self.state is not SeqState.CLOSING:
            self._free()

    def _free(self) -> None:
        if self.state is SeqState.CLOSED:
            return
        self._closed = True
        self.state = SeqState.CLOSED
        self.mask_buffer = None
        self._final_log = self._native.log_bytes(self.slot)
        self.runtime._unregister(self)
        store, memory, self.store = self.store, getattr(self, "memory", None), None   # no memory: instantiation failed
        self.instance = self.memory = None
        self._globals = {}
        self._release_slot()
        if store is not None and memory is not None:
            resident = self.runtime.resident
            base, size = instance.memory_base(memory, store), memory.data_len(store)
            with resident.lock:   # the slot is freed and recorded as free at once (resident.py)
                store.close()
                resident.freed(base, size)
        elif store is not None:
            store.close()

