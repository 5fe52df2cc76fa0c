"""From engine events to what a client is sent: per fork, the text appended (and taken back)
since the last update, logs, variable writes, errors, finish; per request, token usage.

Runs on the engine thread (it decodes tokens with the backend's tokenizer). The HTTP side turns
each `Update` into AICI's `run` object or OpenAI's chunk (`protocol.py`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aicirt.engine import FinishEvent, ForkEvent, GenRequest, GenSeq, LogEvent, TokensEvent, VarEvent
from aicirt.engine.sampling import partial_stop
from aicirt.errors import failure_message
from aicirt.runner.run import _valid_utf8_prefix


@dataclass
class ForkDelta:
    """One fork's change in one step. `backtrack`: characters of the text sent so far to remove
    before appending `text` (a controller took tokens back); `finish_reason`: the engine's
    ("stop", "eos", "length", "error", "abort") once the fork has ended; `error`: why it failed,
    worded by `aicirt.errors.failure_message` (the controller's own reason first); `micros`:
    microseconds its controller ran since the fork's last update (AICI's `micros`)."""
    index: int
    text: str = ""
    backtrack: int = 0
    logs: str = ""
    storage: list = field(default_factory=list)      # [(op, name, value bytes)]
    error: str = ""
    micros: int = 0
    finish_reason: str | None = None
    #: With the request's `logprobs`: (token id, `aicirt.engine.sampling.TokenLogprob`) for each
    #: token whose text reached the client with this delta.
    logprobs: list = field(default_factory=list)


@dataclass
class Usage:
    sampled_tokens: int = 0
    ff_tokens: int = 0           # prompt tokens and tokens fast-forwarded by controllers

    @property
    def cost(self) -> int:
        return 2 * self.sampled_tokens + self.ff_tokens    # AICI's formula


@dataclass
class Update:
    forks: list[ForkDelta]
    usage: Usage
    finished: bool


class RunTracker:
    """Follows one engine request. Each fork's text starts empty for the client: a fork's first
    delta carries everything it inherited, so concatenating a fork's deltas gives its whole text."""

    def __init__(self, backend: Any, req: GenRequest):
        self.backend = backend
        self.req = req
        self.sent: dict[int, bytes] = {}          # label -> bytes of text the client has
        self.usage = Usage(ff_tokens=len(req.prompt))
        self.variables: dict[str, bytes] = {}     # as the controllers left them (kept past the request)
        self._micros_sent: dict[int, float] = {}  # label -> the fork's controller_us at its last update
        self._lp_sent: dict[int, tuple[int, int]] = {}   # label -> (logprob entries sent, their bytes)

    def update(self, events: list) -> Update | None:
        """The update for this request's `events` from one step; None when nothing changed."""
        touched: dict[int, ForkDelta] = {}

        def delta(seq: GenSeq) -> ForkDelta:
            d = touched.get(seq.label)
            if d is None:
                d = touched[seq.label] = ForkDelta(seq.label)
            return d

        appended = 0
        by_seq_id = {s.seq_id: s for s in self.req.sequences}
        for ev in events:
            if isinstance(ev, TokensEvent):
                appended += len(ev.tokens)
                delta(ev.seq)
            elif isinstance(ev, ForkEvent):
                delta(ev.parent)
                delta(ev.child)
            elif isinstance(ev, LogEvent):
                delta(ev.seq).logs += ev.text
            elif isinstance(ev, VarEvent):
                seq = by_seq_id.get(ev.seq_id) or self.req.sequences[0]
                delta(seq).storage.append((ev.op, ev.name, ev.value))
                old = self.variables.get(ev.name, b"") if ev.op == "append" else b""
                self.variables[ev.name] = old + ev.value
            elif isinstance(ev, FinishEvent):
                d = delta(ev.seq)
                d.error = self._error(ev)
        if not touched:
            return None
        # The engine resets `sampled` for every live sequence at the start of a step and sets it
        # when the sequence samples, so a sequence with events this step sampled iff it is set.
        sampled = sum(1 for label in touched if self.req.sequences[label].sampled is not None)
        self.usage.sampled_tokens += sampled
        self.usage.ff_tokens += appended - sampled
        for label, d in touched.items():
            seq = self.req.sequences[label]
            self._text(seq, d)
            if self.req.params.logprobs is not None:
                self._logprobs(seq, d)
            d.finish_reason = seq.finish_reason
            d.micros = int(seq.controller_us - self._micros_sent.get(label, 0.0))
            self._micros_sent[label] = seq.controller_us
        # A copy: the handler serialises it on another thread while this one counts on.
        usage = Usage(self.usage.sampled_tokens, self.usage.ff_tokens)
        return Update(sorted(touched.values(), key=lambda d: d.index), usage, self.req.finished)

    @staticmethod
    def _error(ev: FinishEvent) -> str:
        """The fork's error as the client reads it: a failure (reason "error") leads with what the
        controller last logged (`failure_message`); other reasons' errors as the engine gave them."""
        if not ev.error:
            return ""
        return failure_message(ev.error, "".join(ev.seq.logs)) if ev.reason == "error" else ev.error

    def _text(self, seq: GenSeq, d: ForkDelta) -> None:
        """Diff the fork's decoded output against what was sent (whole characters only)."""
        if seq.finish_reason is not None:
            new = seq.text_bytes                 # cut before a stop string, if one ended it
            end = len(new)
        else:
            new = self.backend.decode_bytes(seq.output_tokens)
            # Text that may be the start of a stop string waits until the stop is ruled out.
            end = min(_valid_utf8_prefix(new), len(new) - partial_stop(new, self.req.params.stop))
        old = self.sent.get(seq.label, b"")
        common = 0
        limit = min(len(old), end)
        while common < limit and old[common] == new[common]:
            common += 1
        while 0 < common < len(old) and (old[common] & 0xC0) == 0x80:
            common -= 1                          # back to the start of a character cut in two
        d.backtrack = len(old[common:].decode("utf-8", "replace"))
        d.text = new[common:end].decode("utf-8", "replace")
        self.sent[seq.label] = new[:end]

    def _logprobs(self, seq: GenSeq, d: ForkDelta) -> None:
        """The logprob entries of the tokens whose text the client now has in full (once the fork
        ends: every token that begins before the end of its text)."""
        start = len(self.req.prompt)
        tokens, entries = seq.tokens[start:], seq.logprobs
        count, covered = self._lp_sent.get(seq.label, (0, 0))
        if count > len(entries):                 # a splice took tokens back (their entries were sent)
            count = len(entries)
            covered = len(self.backend.decode_bytes(tokens[:count]))
        limit = len(self.sent.get(seq.label, b""))
        while count < min(len(entries), len(tokens)):
            size = len(self.backend.decode_bytes([tokens[count]]))
            if (covered >= limit) if seq.finish_reason is not None else (covered + size > limit):
                break
            d.logprobs.append((tokens[count], entries[count]))
            count, covered = count + 1, covered + size
        self._lp_sent[seq.label] = (count, covered)

    def abort_update(self) -> Update:
        """The final update for a request ended by the server (client gone, engine failure)."""
        forks = [ForkDelta(s.label, finish_reason=s.finish_reason or "abort", error=s.error or "")
                 for s in self.req.sequences]
        return Update(forks, Usage(self.usage.sampled_tokens, self.usage.ff_tokens), True)
