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

What the hot path needs on every step lives in the native slot, not here, so that a batch of
common rows touches no Python object per sequence: the tokens the controller has seen, whether a
call is out (RUNNING is derived from it), the call count, whether it may be called at all.
"""
from __future__ import annotations

import enum
import itertools
import weakref
from typing import TYPE_CHECKING

import wasmtime

from ..errors import ControllerError
from ..native import instance
from ..native.types import CData
from ..owned import Owned

if TYPE_CHECKING:
    import numpy as np

    from .memory import MemoryBudget
    from ..native import Native
    from ..native.instance import SpawnPlan
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

    `id` is the WIT seq-id; `index` the integer the rows API addresses it by (reused after
    close); `state` a :class:`SeqState`; `error` says why it failed (then `finished`); `log` is its
    controller log (the last Limits.log_bytes bytes).
    """

    def __init__(self, request: "Request", *, forked: bool = False) -> None:
        rt = request.runtime
        native = rt.native
        # its share of the runtime's memory budget: a new request's sequence past it is refused
        # (OverBudget) before anything is made; a fork is counted, never refused (memory.py)
        budget = rt.memory_budget
        slot = native.new_slot()   # zeroed: nothing to free yet if the budget refuses
        charged = budget.charge() if forked else budget.reserve()
        # Its budget share and its slot's native buffers (its log, its tokens, its Store) are given
        # back once, at close or when collected unclosed: one finalizer for both (each costs ~2 µs
        # to make, a fork's largest Python cost); `_owned[0]` is the slot it frees (take_state_of
        # swaps it).
        self._owned = [slot]
        self._release_native = weakref.finalize(self, _release_native, budget, charged, native, self._owned)
        self.request = request
        self.runtime = rt
        self.id = next(_ids)
        self._state = SeqState.IDLE   # IDLE covers RUNNING: a call out in a batch not yet waited for
        self.error: str | None = None
        self.late_steps = 0
        self.mask_buffer: tuple | None = None      # (mask array, row) a late call writes into
        self._native = native
        self._registry = rt.registry
        self.slot = slot
        # the runtime's limits and vocabulary, the request's capabilities, argument and variables
        native.ffi.memmove(slot, request.slot_template, native.slot_bytes)
        slot.seq_id = self.id
        self._group_buf = None                     # the fork group reported on the next call
        # the object API's copy of the tokens its controller holds (None: compare from scratch;
        # always None once closed): batch.py's to read and write
        self.sent_tokens: list[int] | None = None
        self._views: tuple | None = None           # wasmtime-py views of the Store, memory, instance (on demand)
        plan = self._plan = rt.spawn_plan(request.controller)
        self.index = self._registry.add(self, native.addr(slot))
        resident = self._registry.resident
        # No guest code runs here (admission refuses a start function), so the epoch clock need
        # not tick; a slot is taken and recorded as taken at once.
        with resident.lock:
            failed = instance.spawn(native, plan, slot)
            if failed is None:
                slot.resident_bytes = resident.taken(native.memory(slot)[0])
        if failed is not None:   # no free slot, or memory limit too small
            self.free()
            raise ControllerError(f"instantiating {request.controller.name}: {failed}")

    def _describe(self) -> str:
        return f"sequence {self.id}"

    # -- wasmtime-py views, made on demand (the hot path never needs them) ------------------------
    def _view(self) -> tuple:
        if self._views is None:
            if self._state is SeqState.CLOSED:
                raise ValueError(f"{self._describe()} is closed")
            store = instance.store_view(self.runtime.engine, self.slot, self._native)
            self._views = (store, instance.memory_view(self._native, self.slot), instance.instance_view(self._native, self.slot))
        return self._views

    @property
    def store(self) -> wasmtime.Store | None:
        """The sequence's Store as a wasmtime-py object (borrowed; closed with the sequence;
        None once closed)."""
        return None if self._state is SeqState.CLOSED else self._view()[0]

    @property
    def memory(self) -> wasmtime.Memory | None:
        """Its linear memory as a wasmtime-py object (None once closed)."""
        return None if self._state is SeqState.CLOSED else self._view()[1]

    @property
    def instance(self) -> wasmtime.Instance | None:
        """Its instance as a wasmtime-py object (None once closed)."""
        return None if self._state is SeqState.CLOSED else self._view()[2]

    @property
    def _globals(self) -> dict[int, wasmtime.Global]:
        """Its mutable globals by index, as the loader exported them (what a fork copies)."""
        store, _, inst = self._view()
        return instance.global_views(store, inst, self._plan)

    @classmethod
    def instantiate(cls, request: "Request") -> "Sequence":
        """A fresh instance. Its `_initialize`, if any, runs on a worker before its first call
        (under the first-call limit), so that it never holds up the engine's thread."""
        return cls(request)

    # -- what the batch may ask ----------------------------------------------------------------
    @property
    def state(self) -> SeqState:
        if self._state is SeqState.IDLE and self.slot.call_out:
            return SeqState.RUNNING
        return self._state

    @property
    def finished(self) -> bool:
        """Stopped, failed or closed: no more calls."""
        return self._state in (SeqState.FINISHED, SeqState.CLOSING, SeqState.CLOSED)

    @property
    def call_out(self) -> bool:
        """A call was started and not yet collected (it may still be running)."""
        return self._state is not SeqState.CLOSED and bool(self.slot.call_out)

    @property
    def calls(self) -> int:
        """`mid-process` calls started so far."""
        return int(self.slot.calls)

    @property
    def seen(self) -> list[int]:
        """The tokens as the controller last saw them (a copy)."""
        return self._native.seen_tokens(self.slot) if self._state is not SeqState.CLOSED else []

    def mark_late(self, masks: "np.ndarray", row: int, counts: bool = True) -> int:
        """RUNNING|LATE -> LATE (the call missed another deadline; it writes into `masks[row]`,
        which stays pinned); returns the steps late in a row (`counts`: whether this step is
        charged to the controller)."""
        if self._state is SeqState.IDLE:
            self._state = SeqState.LATE
        self.slot.call_out = 2
        if self.mask_buffer is None:
            self.mask_buffer = (masks, row)
            self._registry.hold(self, masks)
        self.late_steps += counts
        return self.late_steps

    def collected(self) -> None:
        """The call's result was taken: back to IDLE, or freed if it was closed meanwhile."""
        self.mask_buffer = None
        self.late_steps = 0
        self._registry.unhold(self)
        if self._state is SeqState.CLOSED:
            return
        self.slot.call_out = 0
        if self._state is SeqState.CLOSING:
            self.free()
        elif self._state is SeqState.LATE:
            self._state = SeqState.IDLE

    def finish(self, error: str | None = None) -> None:
        """-> FINISHED (stopped, or failed with `error`); a closing sequence stays closing."""
        if error is not None and self.error is None:
            self.error = error
        if self._state in (SeqState.IDLE, SeqState.LATE):
            self._state = SeqState.FINISHED
            self.slot.stopped = 1
        if self.preparing is not None:   # it prepares its key's template: the cache learns how it ended
            self.runtime.prepared.finished(self, error)

    #: the key of the prepared template this sequence's first call fills (core/prepared.py), or None
    preparing: tuple | None = None

    @property
    def plan(self) -> "SpawnPlan":
        """What every instance of its controller binds in this runtime (native/instance.py)."""
        return self._plan

    # -- fork -------------------------------------------------------------------------------------
    def fork(self) -> "Sequence":
        """A copy of this sequence's controller state as a new sequence of the same request (what
        a fork result does; useful to run alternatives from one compiled state). Raises
        ValueError unless the sequence is idle, ControllerError if the copy cannot be made."""
        if self.state is not SeqState.IDLE:
            raise ValueError(f"{self._describe()} is {self.state.value}: only an idle sequence can be forked")
        return self.fork_many(1)[0]

    def fork_many(self, n: int) -> list["Sequence"]:
        """`n` new sequences whose controllers are copies of this one's (linear memory and every
        mutable global); all of the group get the fork group on their next call. Raises
        ControllerError (closing any child made) if a copy cannot be made."""
        children: list[Sequence] = []
        try:
            for _ in range(n):
                child = Sequence(self.request, forked=True)
                children.append(child)
                instance.fork_copy(self._native, self._plan, self.slot, child.slot)
        except Exception as e:
            for child in children:
                child.close()
            raise ControllerError(f"fork failed: {e}") from None
        self.request._adopt(children)
        group = [self.id] + [c.id for c in children]
        buf = self._native.ffi.new("uint32_t[]", group)   # one array for the group: the calls only read it
        for member in (self, *children):
            member._report_group(buf, len(group))
        return children

    def draft_copy(self, shadow: "Request", root: "Sequence") -> "Sequence":
        """A copy of this (idle) sequence as a sequence of `shadow` (speculate.py's stand-in
        request), seen by its controller exactly as `root` (its seq-id, its pending fork group, its
        random stream); no fork group is reported to either. Raises ControllerError if the copy
        cannot be made."""
        child = Sequence(shadow)
        shadow.sequences.append(child)
        rng = self.slot.wasi_rng
        try:
            instance.fork_copy(self._native, self._plan, self.slot, child.slot)
        except Exception as e:
            child.close()
            raise ControllerError(f"speculation: copy failed: {e}") from None
        self.slot.wasi_rng = rng   # fork_copy split the stream; a draft continues it unsplit
        child.slot.wasi_rng = rng
        child.slot.seq_id = root.id
        if self.slot.n_group:
            child._group_buf = self._group_buf
            child.slot.group, child.slot.n_group = self.slot.group, self.slot.n_group
        return child

    def take_state_of(self, fork: "Sequence", req: "Request") -> bytes:
        """This sequence takes `fork`'s controller state (its native slot: instance, tokens seen,
        records) and `fork` takes this one's old one, to be closed; returns the old log. The rows
        API's index of this sequence now addresses the new state (speculate.py's commit)."""
        native = self._native
        old_log = native.log_bytes(self.slot)
        for s in (self, fork):
            if s._views is not None:
                s._views[0].close()
                s._views = None
        a, b = self.slot, fork.slot
        self._registry.swap_slots(self, fork, native.addr(a), native.addr(b))
        self.slot, fork.slot = b, a
        self._owned[0], fork._owned[0] = b, a   # what each one's finalizer frees
        self._group_buf, fork._group_buf = fork._group_buf, self._group_buf
        # the object API's copies of what each controller holds go with the controllers
        self.sent_tokens, fork.sent_tokens = fork.sent_tokens, self.sent_tokens
        b.seq_id, a.seq_id = self.id, fork.id
        b.vars = native.ffi.NULL if req.vars.ptr is None else req.vars.ptr
        return old_log

    def _report_group(self, buf: CData, n: int) -> None:
        """The fork group this sequence's next call reports (`fork-group`): the `n` ids in `buf`
        (a cffi uint32_t array, kept alive here until replaced)."""
        self._group_buf = buf
        self.slot.group = buf
        self.slot.n_group = n

    # -- log -------------------------------------------------------------------------------------
    @property
    def log(self) -> bytes:
        """The controller's log (the last Limits.log_bytes bytes; kept after close)."""
        return self._native.log_bytes(self.slot) if self._state is not SeqState.CLOSED else self._final_log

    def take_call_log(self) -> str:
        return self._native.take_call_log(self.slot).decode("utf-8", "replace")

    # -- lifetime ----------------------------------------------------------------------------------
    def _release(self) -> None:
        """Free the instance and its Store; while a call is still out, once it ends."""
        if self._state is SeqState.CLOSING:
            return
        self.sent_tokens = None   # the object API checks a sequence without one for being closed
        self.runtime.object_rows = None   # the object API's cached last batch keeps no closed sequence alive
        self.slot.stopped = 1
        if self.call_out:
            self._state = SeqState.CLOSING
            self._registry.closing(self)
        else:
            self.free()

    def free(self) -> None:
        if self._state is SeqState.CLOSED:
            return
        self._closed = True
        self._final_log = self._native.log_bytes(self.slot)
        self._state = SeqState.CLOSED
        self.mask_buffer = None
        self.sent_tokens = None
        self._registry.remove(self, self._native.addr(self.slot))
        views, self._views = self._views, None
        if views is not None:
            views[0].close()   # a borrowed view: using it from now on raises
        slot = self.slot
        if slot.store != self._native.ffi.NULL:
            if slot.mem.a.store_id:   # instantiated: its pooled slot is recorded as free
                resident = self._registry.resident
                base, size = self._native.memory(slot)   # the slot still points at the instance's memory
                with resident.lock:   # the slot is freed and recorded as free at once (memory.ResidentSlots)
                    self._native.store_delete(slot)
                    resident.freed(base, size)
            else:
                self._native.store_delete(slot)
        if self.preparing is not None:   # before its slot goes: the template it filled, or not
            self.runtime.prepared.finished(self, None)
            self.preparing = None
        self._release_native()   # its budget share, the slot's buffers


def _release_native(budget: "MemoryBudget", charged: int, native: "Native", owned: list) -> None:
    """A sequence's finalizer (run once: at close, or when it is collected unclosed): its share of
    the memory budget back, its slot's native buffers and Store freed."""
    budget.release(charged)
    native.release(owned[0])
