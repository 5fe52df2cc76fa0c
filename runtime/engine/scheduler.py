"""Which requests the engine holds, and in which queue: waiting, running, finished.

Modelled on nano-vllm's scheduler: `schedule()` picks what runs this step, `postprocess()`
retires what finished. A request lives here from `add` until the step that returns its last
events; after that only the caller holds it, so step time and memory depend on the requests in
flight, never on how many came before.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from .types import GenRequest, GenSeq


class Scheduler:
    """Three queues of `GenRequest`, each request in exactly one of them.

    - `waiting`: added since the last step; they join `running` when the next step is scheduled;
    - `running`: started, at least one sequence still live;
    - `finished`: ended outside a step (aborted, or a controller that failed to start); their
      events go out with the next step, which retires them.
    A running request whose sequences have all finished is retired by `postprocess()`.
    """

    def __init__(self) -> None:
        self.waiting: deque[GenRequest] = deque()
        self.running: list[GenRequest] = []
        self.finished: list[GenRequest] = []
        self._held: set[GenRequest] = set()   # the requests above, for O(1) `in` (hashed by identity)

    # --- queries ---------------------------------------------------------------------------
    def __contains__(self, req: GenRequest) -> bool:
        return req in self._held

    def __len__(self) -> int:
        return len(self._held)

    def __iter__(self) -> Iterator[GenRequest]:
        """Every held request: waiting, running, then finished (not yet retired)."""
        yield from self.waiting
        yield from self.running
        yield from self.finished

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_finished(self) -> int:
        return len(self.finished)

    @property
    def is_empty(self) -> bool:
        return not self._held

    # --- transitions -----------------------------------------------------------------------
    def add(self, req: GenRequest) -> None:
        """Hold `req` until it is retired; it waits for the next step unless it has already
        finished. Raises `ValueError` if it is already held."""
        if req in self:
            raise ValueError(f"request {req.id} was already added")
        self._held.add(req)
        (self.finished if req.finished else self.waiting).append(req)

    def schedule(self) -> list[GenSeq]:
        """Start the waiting requests; return the live sequences of every running request."""
        if self.waiting:
            self.running.extend(self.waiting)
            self.waiting.clear()
        return [s for r in self.running for s in r.sequences if s.finish_reason is None]

    def finish(self, req: GenRequest) -> None:
        """Move a held request whose sequences have all finished (outside a step) to `finished`."""
        if req in self.finished:
            return
        if req in self.waiting:
            self.waiting.remove(req)
        else:
            self.running.remove(req)
        self.finished.append(req)

    def postprocess(self) -> list[GenRequest]:
        """Retire every finished request (those in `finished` and running ones with no live
        sequence left) and return them: the scheduler no longer holds them."""
        done = self.finished
        self.finished = []
        if any(r.finished for r in self.running):
            done += [r for r in self.running if r.finished]
            self.running = [r for r in self.running if not r.finished]
        for r in done:
            self._held.discard(r)
        return done

    def drain(self) -> list[GenRequest]:
        """Let go of every request, finished or not (the engine is closing); returns them."""
        out = list(self)
        self.waiting.clear()
        self.running, self.finished = [], []
        self._held.clear()
        return out
