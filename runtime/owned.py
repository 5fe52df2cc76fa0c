"""The one ownership base of every native-backed object (Runtime, Request, Sequence, BatchHandle).

`close()` is idempotent; `with` closes; using an object after close raises ``ValueError`` naming
it. Subclasses implement `_release()` (called once) and call `check_open()` where a use after
close would otherwise reach freed native state.
"""
from __future__ import annotations

from typing import TypeVar

T = TypeVar("T", bound="Owned")


class Owned:
    _closed: bool = False

    def check_open(self) -> None:
        if self._closed:
            raise ValueError(f"{self._describe()} is closed")

    def _describe(self) -> str:
        return type(self).__name__

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Free what this object holds. Idempotent."""
        if not self._closed:
            self._closed = True
            self._release()

    def _release(self) -> None:
        raise NotImplementedError

    def __enter__(self: T) -> T:
        self.check_open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
