"""Shrink a failing fuzz run to a short trace: fewer and simpler choices, same failure.

Candidates are made from the failing run's plan (its recorded choice streams): no late steps,
streams cut short (past its end a stream reads zeros: the first allowed token, no engine
backtrack), chunks deleted, chunks zeroed, single choices made smaller. A candidate is kept when
its run fails with the same kind of failure (`FuzzFailure.key`) after fewer calls, or as many
calls from fewer choices. Bounded by a number of runs and a time budget.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .choices import Plan

if TYPE_CHECKING:
    from .fuzzer import Fuzzer, FuzzFailure


def _measure(f: "FuzzFailure") -> tuple[int, int, int, int, int]:
    """Smaller is simpler: fewer calls, a shorter trace, fewer then smaller choices (trailing
    zeros do not count: past its end a stream reads zeros anyway)."""
    values = [v for s in (*f.plan.streams.values(), f.plan.late) for v in s]
    return f.calls, len(f.trace), f.plan.trimmed().size, sum(1 for v in values if v), sum(values)


def _candidates(plan: Plan) -> Iterator[Plan]:
    if plan.late:
        yield Plan(plan.streams, [])
    for label in sorted(plan.streams, key=len, reverse=True):
        s = plan.streams[label]
        for cut in (len(s) // 2, len(s) * 3 // 4, len(s) - 1):
            if 0 <= cut < len(s):
                yield Plan({**plan.streams, label: s[:cut]}, plan.late)
        for size in (8, 4, 2, 1):
            for i in range(0, len(s) - size + 1, size):
                yield Plan({**plan.streams, label: s[:i] + s[i + size:]}, plan.late)
                if any(s[i:i + size]):
                    yield Plan({**plan.streams, label: s[:i] + [0] * size + s[i + size:]}, plan.late)
        for i, v in enumerate(s):
            for smaller in (v % 2, v % 16, v // 2):
                if smaller < v:
                    yield Plan({**plan.streams, label: s[:i] + [smaller] + s[i + 1:]}, plan.late)
                    break


def shrink(fuzzer: "Fuzzer", failure: "FuzzFailure", *, max_steps: int, max_runs: int = 300,
           time_s: float = 20.0) -> "FuzzFailure":
    """The smallest failure found with `failure`'s key (`failure` itself if none is smaller)."""
    best, key = failure, failure.key
    t0, runs = time.perf_counter(), 0
    improved = True
    while improved and runs < max_runs and time.perf_counter() - t0 < time_s:
        improved = False
        for candidate in _candidates(best.plan):
            if runs >= max_runs or time.perf_counter() - t0 >= time_s:
                break
            runs += 1
            got = fuzzer.run(plan=candidate, max_steps=max_steps).failure
            if got is not None and got.key == key and _measure(got) < _measure(best):
                got.seed = failure.seed
                best, improved = got, True
                break      # restart from the smaller plan
    if best is not failure:
        best.plan = best.plan.trimmed()
        best.shrunk_from = failure.calls
    return best
