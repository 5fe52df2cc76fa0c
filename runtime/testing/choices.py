"""Where every random decision of a fuzz run comes from: one stream of integers per sequence.

A run is a pure function of its streams (plus timing, which only decides *when* a late result
arrives, never what it is). Generating draws from a seeded RNG and records what it drew;
replaying reads a recorded list back, and past its end reads zeros, the simplest choice. So a
failure is pinned to a list of integers, which the shrinker makes shorter and smaller, and
which Hypothesis can generate and shrink itself.
"""
from __future__ import annotations

import numpy as np

CHOICE_LIMIT = 1 << 32        # every choice is in [0, CHOICE_LIMIT)


class Choices:
    """Draws integers; `drawn` records them (the stream to replay this run)."""

    def __init__(self, rng: np.random.Generator | None = None, replay: list[int] | None = None):
        self._rng = rng
        self._replay = list(replay) if replay is not None else None
        self.drawn: list[int] = []

    @classmethod
    def seeded(cls, seed: int, label: str) -> "Choices":
        """The stream of sequence `label` in run `seed`: independent of every other sequence,
        so a fork or a late neighbour never shifts what this sequence draws."""
        key = [seed & 0xFFFFFFFF, seed >> 32 & 0xFFFFFFFF, *label.encode()]
        return cls(rng=np.random.default_rng(key))

    def draw(self) -> int:
        if self._replay is not None:
            k = len(self.drawn)
            value = self._replay[k] % CHOICE_LIMIT if k < len(self._replay) else 0
        else:
            value = int(self._rng.integers(0, CHOICE_LIMIT))  # type: ignore[union-attr]  # no replay: a generator
        self.drawn.append(value)
        return value

    def below(self, n: int) -> int:
        """A choice in [0, n); 0 is the simplest (what shrinking moves towards)."""
        v = self.draw()
        return v % n if n > 1 else 0

    def chance(self, one_in: int) -> bool:
        """True about once in `one_in` draws; a zero choice is always False."""
        v = self.draw()
        return v != 0 and v % one_in == 0


class Plan:
    """The recorded streams of a run, by sequence label (Hypothesis strategies build these too).
    `late`: the engine-level stream that decides which steps wait 0 s (late steps)."""

    def __init__(self, streams: dict[str, list[int]] | None = None, late: list[int] | None = None):
        self.streams = {k: list(v) for k, v in (streams or {}).items()}
        self.late = list(late or [])

    def choices(self, label: str) -> Choices:
        return Choices(replay=self.streams.get(label, []))

    def late_choices(self) -> Choices:
        return Choices(replay=self.late)

    def trimmed(self) -> "Plan":
        """The same plan without trailing zeros (which reading past a stream's end gives)."""
        def trim(s: list[int]) -> list[int]:
            n = len(s)
            while n and not s[n - 1]:
                n -= 1
            return s[:n]
        return Plan({k: trim(v) for k, v in self.streams.items()}, trim(self.late))

    @property
    def size(self) -> int:
        return sum(map(len, self.streams.values())) + len(self.late)

    def to_json(self) -> dict:
        return {"streams": self.streams, "late": self.late}

    @classmethod
    def from_json(cls, data: dict) -> "Plan":
        return cls(data.get("streams"), data.get("late"))

    def __repr__(self) -> str:
        return f"Plan({self.size} choices over {len(self.streams)} sequences)"
