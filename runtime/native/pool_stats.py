"""What a worker pool reports about itself (both hot paths' pools)."""
from __future__ import annotations

from typing import NamedTuple


class PoolStats(NamedTuple):
    """A worker pool at one moment. `stalled` workers run a call past the stall threshold at
    lowered priority and leave once it ends; `saturated` is true when stalled calls hold every
    extra worker (Limits.max_extra_workers), so a further stuck call holds up the queue."""

    threads: int
    stalled: int
    busy: int
    queued: int
    saturated: bool
