"""What one `mid-process` call tells the engine (docs/protocol.md#semantics), as plain typed values."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .sequence import Sequence

TokenId = int


@dataclass(frozen=True, init=False)
class StepInput:
    """One item of :meth:`Runtime.submit`: a sequence, its full current token list, and the token
    sampled at the previous step (None if nothing was sampled).

    `unchanged` (optional): how many leading tokens are the same as at this sequence's previous
    submit (an engine knows: the least length it backtracked to). The runtime then compares only
    from there, instead of the whole list (~7 µs per 4k tokens). A wrong hint gives the controller
    a wrong edit."""
    seq: "Sequence"
    tokens: "list[TokenId]"
    sampled: "TokenId | None" = None
    unchanged: "int | None" = None

    def __init__(self, seq: "Sequence", tokens: "list[TokenId]", sampled: "TokenId | None" = None,
                 unchanged: "int | None" = None) -> None:
        # A caller makes one per sequence per step: the frozen dataclass's own __init__ (one
        # object.__setattr__ a field) cost ~0.8 µs of it, these four stores ~0.2 µs. Still frozen:
        # assigning a field afterwards raises dataclasses.FrozenInstanceError.
        d = self.__dict__
        d["seq"] = seq
        d["tokens"] = tokens
        d["sampled"] = sampled
        d["unchanged"] = unchanged


@dataclass(frozen=True)
class Splice:
    """Backtrack `backtrack` tokens (counting the sampled one), then append `ff_tokens`;
    applies when the sampled token is in `when_sampled` (empty: always)."""
    when_sampled: tuple[TokenId, ...]
    backtrack: int
    ff_tokens: tuple[TokenId, ...]


def splice_for(splices: "tuple[Splice, ...] | list[Splice]", sampled: TokenId) -> Splice | None:
    """The splice that applies once `sampled` is appended (docs/protocol.md#semantics): the first whose
    `when_sampled` is empty or contains it; None when none does. Every host applies this rule."""
    return next((sp for sp in splices if not sp.when_sampled or sampled in sp.when_sampled), None)


@dataclass(frozen=True)
class Branch:
    """`mask_row` indexes `BatchOutcome.masks` (None: do not sample; one unconditional splice)."""
    mask_row: int | None
    temperature: float | None
    splices: tuple[Splice, ...] = ()

    @property
    def is_noop(self) -> bool:
        return self.mask_row is None and self.splices[0].backtrack == 0 and not self.splices[0].ff_tokens


@dataclass
class StepResult:
    """One sequence's outcome. `status`: "ok"; "pending" (late: no-op this step, the result
    arrives with a later step); "error" (the sequence is finished; `error` says why).
    `branches == []` with status "ok" means stop. `forks[i]` runs `branches[i + 1]`."""
    seq: "Sequence"
    status: Literal["ok", "pending", "error"]
    branches: list[Branch] = field(default_factory=list)
    forks: list["Sequence"] = field(default_factory=list)
    error: str | None = None
    logs: str = ""
    elapsed_us: float = 0.0

    @property
    def is_stop(self) -> bool:
        return self.status == "ok" and not self.branches


def mask_result(seq: "Sequence", branch: Branch, elapsed_us: float, _new: Any = object.__new__) -> StepResult:
    """`StepResult(seq, "ok", [branch], elapsed_us=elapsed_us)`, made as the object API's wait
    makes one per row (mapped over the batch): by filling the instance's dict, about half the cost
    of the dataclass's __init__ with its keyword and default-factory handling."""
    r = _new(StepResult)
    d = r.__dict__
    d["seq"] = seq
    d["status"] = "ok"
    d["branches"] = [branch]
    d["forks"] = []
    d["error"] = None
    d["logs"] = ""
    d["elapsed_us"] = elapsed_us
    return r
