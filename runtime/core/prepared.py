"""Prepared templates: a controller's per-argument work done once, shared by every request with it.

A controller may export ``aicirt_prepare`` (core type ``() -> ()``, docs/protocol.md#binary). A
request's first sequence runs it on its worker, after ``_initialize`` and before its first
``mid-process``, under the first-call limit; it reads the request's argument through the `arg`
import and keeps what it compiles in its memory. Its state is then a function of the key

    (the controller module's sha256 and whether it starts from an init snapshot,
     the capabilities granted, the sha256 of the argument)

and of this Runtime's tokenizer and limits (one cache per Runtime: a template is an instance in
its engine). A template is made at a key's ``Limits.prepared_after``-th request (2 by default):
making one copies the prepared instance before that request's ``mid-process`` may change it,
~0.2 ms on its first call, which an argument that never comes back (MaskBench's schemas, a
one-off grammar) should not pay; the requests before it prepare as without the cache. A template
is kept only if its prepare took more than :data:`WORTH_FACTOR` times the copy into it (a later
request pays about that copy to skip the prepare): a small regex's compile runs faster again than
its template is copied, and its key then prepares without one.

:class:`PreparedCache` keeps that state as a *template*: a fresh instance of the controller,
outside every batch, into which the first call's worker copies its instance right
after ``aicirt_prepare`` returned (spawn.c's ``aicirt_capture_run``: only the pages prepare wrote,
:mod:`aicirt.native.pages`). Every later request with the same key starts as a copy of it
(spawn.c's ``aicirt_template_fork``, on the spawning thread: the pages the template holds beyond a
fresh instance, its mutable globals) and does not run ``aicirt_prepare``. What the template holds:

- bounded by ``Limits.prepared_cache_bytes`` (the pages it holds beyond a fresh instance; 0
  disables the cache) and by a count (a template takes one of the pooling allocator's instance
  slots): least recently used first out;
- counted in the Runtime's :class:`~aicirt.core.memory.MemoryBudget` (:meth:`MemoryBudget.hold`):
  while the first call runs, a template may grow to one instance's limit and holds that much; once
  made, what it holds; a template the budget has no room for is not made (the request prepares as
  without the cache);
- released on eviction and at Runtime close (never keeping a closed Runtime's engine alive).

A prepare that failed (a trap, its time limit, a host import it may not call: the first call's
error, stage ``aicirt_prepare``) is remembered per key for :data:`PREPARE_FAILURE_TTL_S`: a new
request with that key then fails on its first call with that error at once, without running it,
its log starting with the failed one's last lines (where a controller says why).
Two requests with the same new key at once both prepare; the first call to start makes the
template, the other runs as without the cache. The log lines prepare writes are its first
request's only (a controller that reports something per request keeps it and logs it from
mid-process). Thread-safe (one lock; a template copy is made under it).
"""
from __future__ import annotations

import hashlib
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..abi import Stage
from ..errors import ControllerError
from ..loader.snapshot import INIT_FAILURE_TTL_S, RememberedFailures
from ..native import instance, pages

if TYPE_CHECKING:
    from ..native import Native
    from ..native.instance import SpawnPlan
    from ..native.types import CData
    from .memory import MemoryBudget, ResidentSlots
    from .request import Request
    from .sequence import Sequence

#: A failed prepare is remembered this long per key (as a failed init is per tokenizer).
PREPARE_FAILURE_TTL_S = INIT_FAILURE_TTL_S
_now = time.monotonic    # the failures' clock (a test moves it on)
#: Templates at most, as a share of the pooling allocator's instance slots (each takes one).
TEMPLATE_SLOT_SHARE = 8
_NOT_RUN = -2            # aicirt_capture.written until the first call's worker copied (or failed to)
#: Keys whose request counts (Limits.prepared_after) are kept, the most recently seen.
SIGHTED_KEYS = 4096
#: A template is kept only if its prepare took more than this many times the copy into it: each later
#: request pays about that copy (the template's pages into a fresh instance) to skip the prepare, and a
#: cheap prepare (a small regex's compile) is faster run again than copied.
WORTH_FACTOR = 2.0
_NOT_WORTH = -1          # PreparedCache._seen's count of a key that makes no template (it did not pay, or its
                         # aicirt_prepare_template failed)
_LOG_KEPT = 1024         # bytes of a failed prepare's log a remembered failure starts its request's log with

Key = tuple


def worth_a_template(prepare_us: float, copy_us: float) -> bool:
    """Whether a template pays: its prepare took more than WORTH_FACTOR times the copy into it
    (what each later request pays, about, to start from it instead of preparing)."""
    return prepare_us > WORTH_FACTOR * copy_us


def prepare_key(request: "Request") -> Key:
    """What a prepared state may depend on, besides the Runtime (its tokenizer and limits)."""
    ctrl = request.controller
    return (ctrl.sha256, ctrl.snapshot, int(request.capabilities), hashlib.sha256(request.arg).digest())


class _Template:
    """A fresh instance of a controller outside every batch: a prepared state once a first call's
    worker copied one into it. Frees its instance once (`release`), or when collected."""

    def __init__(self, native: "Native", plan: "SpawnPlan", resident: "ResidentSlots", model: "CData") -> None:
        slot = native.new_slot()
        native.ffi.memmove(slot, model, native.slot_bytes)   # the request's limits and capabilities
        slot.arg, slot.arg_len, slot.vars, slot.seq_id = native.ffi.NULL, 0, native.ffi.NULL, 0
        self.native, self.plan, self.resident, self.slot = native, plan, resident, slot
        self.bytes = 0      # the pages it holds beyond a fresh instance, once made
        self._free = weakref.finalize(self, native.release, slot)   # collected unreleased: its Store too
        with resident.lock:
            failed = instance.spawn(native, plan, slot)
            if failed is None:
                slot.resident_bytes = resident.taken(native.memory(slot)[0])
        if failed is not None:
            self._free()
            raise ControllerError(f"a prepared template: {failed}")
        if plan.image is None:      # as a fork's first copy: the fresh instance's data image
            plan.image = pages.nonzero_extent(native, *native.memory(slot))
        self.capture = native.ffi.new("aicirt_capture *")
        self.capture.pl, self.capture.dst = plan.impl[0], slot   # spawn made plan.impl
        self.capture.img_lo, self.capture.img_hi = plan.image
        self.capture.written = _NOT_RUN

    @property
    def written(self) -> int:
        return int(self.capture.written)

    def fork_into(self, slot: "CData") -> int:
        """Make the fresh instance in `slot` a copy of this template; the pages written, or -1."""
        assert self.plan.image is not None
        return int(self.native.impl.lib.aicirt_template_fork(self.plan.impl[0], self.slot, slot, *self.plan.image))

    def release(self) -> None:
        if not self._free.alive:
            return
        base, size = self.native.memory(self.slot)
        with self.resident.lock:   # the pooled slot freed and recorded as free at once (memory.ResidentSlots)
            self.native.store_delete(self.slot)
            self.resident.freed(base, size)
        self._free()


@dataclass(eq=False)
class _Pending:
    """A key's first request, preparing: its template is made when its first call's worker copies."""
    template: _Template
    owner: "weakref.ref[Sequence]"
    held: int                              # what the budget holds for it meanwhile


@dataclass
class PreparedStats:
    """Counts since the Runtime started (tests, benchmarks)."""
    prepared: int = 0        # requests that ran aicirt_prepare with a template to fill
    forked: int = 0          # requests started from a template
    failed_fast: int = 0     # requests failed at once with a remembered failure
    unsighted: int = 0       # requests that prepared without a template (before Limits.prepared_after, or not worth one)
    not_worth: int = 0       # templates dropped: their prepare cheaper than WORTH_FACTOR x their copy
    evicted: int = 0
    remembered: int = 0      # prepare failures remembered
    not_cached: list = field(default_factory=list)   # why a template was not kept (the last few)


class PreparedCache:
    """The prepared templates of one Runtime (see the module docstring). `limit_bytes` 0: off
    (every request runs its prepare, as a host that keeps no templates)."""

    def __init__(self, native: "Native", budget: "MemoryBudget", resident: "ResidentSlots", limit_bytes: int,
                 max_templates: int, hold_bytes: int, after: int = 1) -> None:
        self.native, self.budget, self.resident = native, budget, resident
        self.after = after           # Limits.prepared_after
        self._seen: OrderedDict[Key, int] = OrderedDict()   # requests per key without a template yet, or _NOT_WORTH
        self.limit_bytes, self.max_templates, self.hold_bytes = limit_bytes, max(1, max_templates), hold_bytes
        self._ready: OrderedDict[Key, _Template] = OrderedDict()   # least recently used first
        self._pending: dict[Key, _Pending] = {}
        self._failures = RememberedFailures(PREPARE_FAILURE_TTL_S, lambda: _now())
        self._lock = threading.RLock()
        self.stats = PreparedStats()
        self._closed = False

    @property
    def held_bytes(self) -> int:
        """What the templates hold now (Limits.prepared_cache_bytes bounds it)."""
        return sum(t.bytes for t in self._ready.values())

    def __len__(self) -> int:
        return len(self._ready)

    # -- a new request's first sequence -------------------------------------------------------------
    def begin(self, seq: "Sequence") -> None:
        """Called once `seq`, a request's new sequence of a controller that exports aicirt_prepare,
        has its fresh instance: start it from the key's template, fail it with the key's
        remembered failure, or let it prepare (filling a new template if there is none yet).
        Raises ControllerError if a template copy fails (the sequence is then unusable)."""
        if self.limit_bytes <= 0 or self._closed:
            return
        req = seq.request
        key = req.prepare_key
        with self._lock:
            self._settle(key)
            tpl = self._ready.get(key)
            if tpl is not None:
                if tpl.fork_into(seq.slot) < 0:
                    raise ControllerError(f"starting from the prepared template: {self.native.error_text(seq.slot)}")
                self._ready.move_to_end(key)
                self.stats.forked += 1
                return
            failed = self._failed_before(key)
            if failed is not None:
                fault, log = failed
                if log:
                    self.native.log_append(seq.slot, log)   # its first call's log, as the failed one's
                self.native.set_fault(seq.slot, fault)
                seq.slot.needs_prepare = -1   # step.c: the first call fails at once with this fault
                self.stats.failed_fast += 1
                return
            if key in self._pending:          # another request is preparing it: this one prepares too
                return
            if self._seen.get(key) == _NOT_WORTH:   # its prepare is cheaper than a template's copy
                self.stats.unsighted += 1
                return
            if not self._sighted(key):        # too early: this request prepares without a template
                self.stats.unsighted += 1
                return
            if not self.budget.hold(self.hold_bytes):
                self._not_cached("the memory budget has no room for a template")
                return
            try:
                tpl = _Template(self.native, seq.plan, self.resident, req.slot_template)
            except ControllerError as e:
                self.budget.unhold(self.hold_bytes)
                self._not_cached(str(e))
                return
            self._pending[key] = _Pending(tpl, weakref.ref(seq), self.hold_bytes)
            seq.slot.capture = tpl.capture
            seq.preparing = key
            self.stats.prepared += 1

    # -- what its first call did ---------------------------------------------------------------------
    def finished(self, seq: "Sequence", error: str | None) -> None:
        """`seq`, the preparing sequence of its key, finished (with `error`) or was freed (None)."""
        key = seq.preparing
        if key is None:
            return
        with self._lock:
            p = self._pending.get(key)
            if p is None or p.owner() not in (seq, None):
                return
            if p.template.written == _NOT_RUN and error is not None and seq.calls == 1:
                cause = _prepare_cause(error)
                if cause is not None:   # with its log's last lines: the controller's reason (errors.failure_message)
                    self._failures.put(key, (cause, bytes(seq.log[-_LOG_KEPT:])))
                    self.stats.remembered += 1
                elif error.startswith(Stage.PREPARE_TEMPLATE.where + ": "):
                    # its prepare is sound, its template part is not: later requests prepare without one
                    self._seen[key] = _NOT_WORTH
                    self._not_cached(f"{Stage.PREPARE_TEMPLATE.where} failed: later requests prepare without a "
                                     f"template")
            self._settle(key, owner_done=error is not None or seq.closed)

    def _settle(self, key: Key, owner_done: bool = False) -> None:
        """A pending template whose copy ran becomes the key's template (or is dropped); one whose
        owner is done without a copy is dropped."""
        p = self._pending.get(key)
        if p is None:
            return
        written = p.template.written
        owner = p.owner()
        if written == _NOT_RUN and not owner_done and owner is not None and not owner.closed:
            return            # its first call has not got there yet
        if written == _NOT_RUN and owner is not None and owner.call_out:
            return            # done with an error, but its worker may still hold the template: freed later
        del self._pending[key]
        if owner is not None and not owner.call_out:
            owner.slot.capture = self.native.ffi.NULL
        tpl = p.template
        if written < 0:
            if written == -1:
                self._not_cached(f"copying the prepared instance failed: {self.native.error_text(tpl.slot)}")
            self.budget.unhold(p.held)
            tpl.release()
            return
        tpl.bytes = written * pages.PAGE
        self.budget.unhold(p.held)
        copy_us, prepare_us = tpl.capture.ns / 1e3, float(tpl.capture.prepare_us)
        if not worth_a_template(prepare_us, copy_us):
            self._not_cached(f"its prepare ({prepare_us:.0f} µs) is cheaper than {WORTH_FACTOR:g}x the copy into "
                             f"its template ({copy_us:.0f} µs): later requests prepare again")
            self._seen[key] = _NOT_WORTH
            self.stats.not_worth += 1
            tpl.release()
            return
        if tpl.bytes > self.limit_bytes or not self.budget.hold(tpl.bytes):
            self._not_cached(f"a template of {tpl.bytes} bytes does not fit (Limits.prepared_cache_bytes "
                             f"{self.limit_bytes}, or the memory budget)")
            tpl.release()
            return
        self._ready[key] = tpl
        self._evict()

    def _sighted(self, key: Key) -> bool:
        """Count a request for `key`; whether it is the `prepared_after`-th or later (the counts of the
        last SIGHTED_KEYS keys are kept)."""
        seen = self._seen.get(key, 0) + 1
        self._seen[key] = seen
        self._seen.move_to_end(key)
        if len(self._seen) > SIGHTED_KEYS:
            self._seen.popitem(last=False)
        return seen >= self.after

    def _evict(self) -> None:
        while self._ready and (self.held_bytes > self.limit_bytes or len(self._ready) > self.max_templates):
            _, old = self._ready.popitem(last=False)
            self.budget.unhold(old.bytes)
            old.release()
            self.stats.evicted += 1

    def _failed_before(self, key: Key) -> tuple[str, bytes] | None:
        """(the fault a new request's first call fails with, the log it starts with), or None."""
        hit = self._failures.get(key)
        if hit is None:
            return None
        (cause, log) = hit[1]
        note = (f" (remembered: it failed {hit[0]:.0f} s ago for this argument; not run again before "
                f"{PREPARE_FAILURE_TTL_S:g} s have passed)")
        room = self.native.FAULT_BYTES - len(note.encode())
        return cause.encode("utf-8")[:room].decode("utf-8", "ignore") + note, log

    def _not_cached(self, why: str) -> None:
        self.stats.not_cached = (self.stats.not_cached + [why])[-8:]

    # -- lifetime ---------------------------------------------------------------------------------------
    def close(self) -> None:
        """Free every template (the Runtime closed: its calls have ended)."""
        with self._lock:
            self._closed = True
            for tpl in self._ready.values():
                self.budget.unhold(tpl.bytes)
                tpl.release()
            self._ready.clear()
            for p in self._pending.values():
                self.budget.unhold(p.held)
                owner = p.owner()
                if owner is not None and not owner.closed:
                    owner.slot.capture = self.native.ffi.NULL
                p.template.release()
            self._pending.clear()
            self._failures.clear()


def _prepare_cause(error: str) -> str | None:
    """The cause of a first call's error in `aicirt_prepare` (batch.py prefixes the stage), else
    None: a failure elsewhere (`_initialize`, mid-process, the step's input) is no prepare's."""
    prefix = Stage.PREPARE.where + ": "
    return error[len(prefix):] if error.startswith(prefix) else None

