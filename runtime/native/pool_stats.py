"""What the worker pool reports about itself."""
from __future__ import annotations

from typing import NamedTuple


class PoolStats(NamedTuple):
    """A worker pool at one moment. `stalled` workers run a call that has used the stall threshold
    (half the soft deadline) in CPU time, and leave once it ends; of them, `running_stalled` hold a turn to run now
    (at most half the cores, at least one), the others wait for theirs, not runnable. `saturated`
    is true when stalled calls hold every extra worker (Limits.max_extra_workers): a further
    stuck call then holds up the queue. `stalls_total` counts the calls ever stalled."""

    threads: int
    stalled: int
    running_stalled: int
    busy: int
    queued: int
    saturated: bool
    stalls_total: int = 0   # calls ever stalled (used half the soft deadline in CPU time)
