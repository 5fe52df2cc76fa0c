"""Helpers several benchmarks share (imported as `_common` from bench/, the folder being on
sys.path when a bench runs as `python bench/x.py`)."""
from __future__ import annotations

from typing import Any


class ForwardCounter:
    """Counts a backend's forward passes: wraps `backend.forward` in place (every later call,
    by an Engine or anything else, goes through it). `calls` is the running count."""

    def __init__(self, backend: Any) -> None:
        self.calls = 0
        forward = backend.forward

        def counted(batch):
            self.calls += 1
            return forward(batch)
        backend.forward = counted
