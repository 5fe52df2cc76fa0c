"""The engine's plain data: requests, sequences, events, timing. No behaviour beyond properties."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

from .backends.base import KVCache
from .sampling import SamplingParams


@dataclass(eq=False)
class GenRequest:
    """One prompt and, optionally, its controller. Forks add sequences to `sequences`.

    Once finished and retired by the engine, it still holds every result (tokens, text,
    variables); its controller instances are closed by then."""
    id: int
    prompt: list[int]
    params: SamplingParams
    rng: np.random.Generator
    ctrl: Any = None                       # aicirt.Request, None for plain generation
    sequences: list[GenSeq] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.sequences)

    @property
    def variables(self) -> dict[str, bytes]:
        """Variables the controllers set (shared by all forks); empty without a controller."""
        return dict(self.ctrl.variables) if self.ctrl is not None else {}


@dataclass(eq=False)
class GenSeq:
    """One sequence. `label` numbers it within its request (0 = the first; forks count up)."""
    request: GenRequest
    label: int
    tokens: list[int]                      # prompt + generated, after every splice
    cache: KVCache
    ctrl: Any = None                       # aicirt.Sequence
    logits: np.ndarray | None = None       # logits after tokens[-1]; None once tokens change
    sampled: int | None = None             # reported to the controller on its next call
    generated: int = 0                     # tokens appended (sampled or fast-forwarded)
    idle_steps: int = 0                    # consecutive no-op steps
    unchanged: int = 0                     # leading tokens unchanged since the last submit (runtime hint)
    synced: int = 0                        # tokens its controller saw at the last submit
    parent: int | None = None              # label of the sequence this one forked from
    finish_reason: str | None = None       # "stop" | "eos" | "length" | "error" | "abort" (or abort's reason)
    error: str | None = None
    logs: list[str] = field(default_factory=list)
    controller_us: float = 0.0             # time its controller's calls took, summed (AICI's `micros`)
    text_bytes: bytes = b""                # output text, set when the sequence finishes (cut at a stop string)
    #: With `params.logprobs` set: one `sampling.TokenLogprob` per token of `tokens` past the prompt's length.
    logprobs: list = field(default_factory=list)

    @property
    def seq_id(self) -> int | None:
        """The controller's seq-id (what `self-seq-id` returns), None without a controller."""
        return self.ctrl.id if self.ctrl is not None else None

    @property
    def kept_prompt(self) -> int:
        """How many prompt tokens are still at the start of `tokens` (splices may backtrack into it)."""
        n = 0
        for a, b in zip(self.request.prompt, self.tokens):
            if a != b:
                break
            n += 1
        return n

    @property
    def output_tokens(self) -> list[int]:
        """Tokens after the part of the prompt that is still there."""
        return self.tokens[self.kept_prompt:]

    @property
    def text(self) -> str:
        return self.text_bytes.decode("utf-8", "replace")


@dataclass
class TokensEvent:
    """Sequence `seq` removed `backtrack` tokens it had shown, then appended `tokens`."""
    request: GenRequest
    seq: GenSeq
    backtrack: int
    tokens: list[int]


@dataclass
class ForkEvent:
    request: GenRequest
    parent: GenSeq
    child: GenSeq


@dataclass
class VarEvent:
    request: GenRequest
    seq_id: int
    op: str                                # "set" | "append"
    name: str
    value: bytes


@dataclass
class LogEvent:
    request: GenRequest
    seq: GenSeq
    text: str


@dataclass
class FinishEvent:
    request: GenRequest
    seq: GenSeq
    reason: str
    error: str | None


Event = Union[TokensEvent, ForkEvent, VarEvent, LogEvent, FinishEvent]


@dataclass
class EngineStats:
    """Wall-clock seconds the engine thread spent in each phase, summed over steps.

    `controller_s` is the time controllers ran (summed over sequences, on worker threads);
    `wait_s` is the engine's time in `wait()` (blocking plus lifting results); `blocked_s` the
    part spent blocked on controllers still running, so `hidden_fraction` =
    1 - blocked_s / controller_s is the share of controller time the forward pass hid (1.0 when
    no controller ran).
    """
    steps: int = 0
    submit_s: float = 0.0
    forward_s: float = 0.0
    wait_s: float = 0.0
    blocked_s: float = 0.0
    apply_s: float = 0.0
    controller_s: float = 0.0
    forwarded_tokens: int = 0

    @property
    def total_s(self) -> float:
        return self.submit_s + self.forward_s + self.wait_s + self.apply_s

    @property
    def hidden_fraction(self) -> float:
        if self.controller_s <= 0:
            return 1.0
        return max(0.0, 1.0 - self.blocked_s / self.controller_s)

    def as_dict(self) -> dict:
        return {"steps": self.steps, "submit_s": self.submit_s, "forward_s": self.forward_s,
                "wait_s": self.wait_s, "blocked_s": self.blocked_s, "apply_s": self.apply_s, "controller_s": self.controller_s,
                "forwarded_tokens": self.forwarded_tokens, "hidden_fraction": self.hidden_fraction}
