"""Fuzz a controller through a seeded, legal, randomised engine (see harness.py).

    from aicirt.testing import Fuzzer

    with Fuzzer("digits.wasm", check=lambda s: s.text_bytes.isdigit() or "not digits") as fz:
        report = fz.fuzz(steps=2000, seed=0)
        assert report.ok, report      # on failure: a shrunk trace and a reproducer file

A run is one request with random capabilities and a random prompt; the engine samples random
tokens inside the controller's masks, applies its splices and forks, lets some calls come back
late and sometimes backtracks by itself. A run fails on the first controller error (trap, time
limit, invalid result, capability not granted...), contract violation, rejected `check`, or
(every few runs) a replay of the same seed that does not reproduce the same trace. A failure is
shrunk to a short trace (fewer, simpler choices) and can be written to a reproducer file that
:func:`replay` (or `aicirt fuzz --replay FILE`) runs again.
"""
from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ..capabilities import Capabilities
from ..limits import Limits
from ..core.runtime import Runtime
from ..host.tokenizer import ByteTokenizer
from .choices import Choices, Plan
from .harness import EngineSettings, FuzzEngine, Track, View, Violation

if TYPE_CHECKING:
    import os

    from ..host.tokenizer import Tokenizer


@dataclass(frozen=True)
class Finished:
    """What `check` is given: one sequence that finished without error."""
    label: str
    tokens: list[int]
    generated: list[int]
    text_bytes: bytes
    finish_reason: str
    logs: str


#: A property of one finished sequence: None/True if it holds, else a message (or False).
Check = Callable[[Finished], "str | bool | None"]


@dataclass
class FuzzFailure:
    seed: int | None             # None: found from a given plan
    kind: str                    # "error", "violation", "check" or "nondeterministic"
    label: str                   # which sequence ("0", forks "0.1", "0.1.2", ...)
    message: str
    step: int                    # engine step it happened at
    calls: int                   # results the failing sequence had received
    trace: list[tuple]           # what each of its results did
    plan: Plan                   # replays this run
    prompt: list[int]
    capabilities: Capabilities
    output: bytes
    logs: str
    reproducer: str | None = None
    shrunk_from: int | None = None   # calls before shrinking

    @property
    def key(self) -> tuple[str, str]:
        """The same bug, whatever the numbers (shrinking keeps failures with this key)."""
        return self.kind, re.sub(r"\d+", "N", self.message)[:120]

    def __str__(self) -> str:
        head = (f"{self.kind} in sequence {self.label} at step {self.step} (call {self.calls}"
                + (f", shrunk from call {self.shrunk_from}" if self.shrunk_from and self.shrunk_from != self.calls else "") + f"): {self.message}")
        lines = [head, f"  seed {self.seed}, capabilities {_caps(self.capabilities)}, prompt {self.prompt[:16]}",
                 f"  output {self.output[:80]!r}"]
        lines += [f"  {i}: {ev}" for i, ev in enumerate(self.trace[-12:], max(0, len(self.trace) - 12))]
        if self.logs:
            lines.append(f"  log: {self.logs[-300:]!r}")
        if self.reproducer:
            lines.append(f"  reproducer: {self.reproducer} (aicirt fuzz --replay {self.reproducer})")
        return "\n".join(lines)


def _caps(c: Capabilities) -> str:
    return "|".join(f.name.lower() for f in Capabilities  # type: ignore[union-attr]  # members have names
                    if f.value in (1, 2, 4, 8) and c & f) or "none"


@dataclass
class RunResult:
    seed: int | None
    plan: Plan
    failure: FuzzFailure | None
    traces: dict[str, list[tuple]]
    finish_reasons: Counter
    steps: int
    calls: int
    capabilities: Capabilities = Capabilities.ALL
    communicating: bool = False      # a request's forks share variables: order may depend on timing


@dataclass
class FuzzReport:
    runs: int = 0
    steps: int = 0
    calls: int = 0
    elapsed_s: float = 0.0
    finish_reasons: Counter = field(default_factory=Counter)
    failures: list[FuzzFailure] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.elapsed_s if self.elapsed_s else 0.0

    def __str__(self) -> str:
        head = (f"{self.runs} runs, {self.steps} steps, {self.calls} controller results in {self.elapsed_s:.1f} s "
                f"({self.steps_per_s:.0f} steps/s); finish reasons: {dict(self.finish_reasons)}")
        return "\n".join([head, *(f"FAILED: {f}" for f in self.failures)] if self.failures else [head, "ok"])


class Fuzzer:
    """Owns a Runtime and the loaded controller; run it many times. Close it (or use `with`).

    `controller`: a path or the module's bytes (kept for reproducer files);
    `capabilities`: None = random per run, else granted as given; `prompt_tokens`: (min, max)
    random prompt length; `check(Finished)` judges each sequence that ends without error;
    `view(Track)` gives the controller's own view of its tokens, checked after every call.
    Raises `aicirt.LoadError` if the module is not a controller at all.
    """

    def __init__(self, controller: Any, arg: bytes | str = b"", *, capabilities: Capabilities | None = None,
                 tokenizer: Tokenizer | None = None, limits: Limits | None = None, workers: int = 2,
                 max_tokens: int = 32,
                 prompt_tokens: tuple[int, int] = (1, 8), check: Check | None = None,
                 settings: EngineSettings | None = None, view: View | None = None) -> None:
        self.tokenizer = tokenizer or ByteTokenizer()
        self.arg = arg.encode() if isinstance(arg, str) else bytes(arg)
        self.capabilities = capabilities
        self.prompt_tokens = prompt_tokens
        self.check = check
        self.view = view
        self.settings = settings or EngineSettings(max_tokens=max_tokens)
        self.limits = limits or Limits()
        self.rt = Runtime(self.tokenizer, limits=self.limits, workers=workers)
        try:
            self.source = controller if isinstance(controller, (bytes, bytearray)) else None
            self.controller = self.rt.load(controller)
        except BaseException:
            self.rt.close()
            raise
        self.source_path = None if isinstance(controller, (bytes, bytearray)) else str(controller)

    def close(self) -> None:
        self.rt.close()

    def __enter__(self) -> "Fuzzer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one run -------------------------------------------------------------------------------
    def run(self, seed: int | None = None, plan: Plan | None = None, max_steps: int = 200) -> RunResult:
        """One request driven for up to `max_steps` steps, from `seed` or replaying `plan`."""
        if (seed is None) == (plan is None):
            raise ValueError("give a seed or a plan")
        made: dict[str, Choices] = {}

        def make(label: str) -> Choices:
            # without a plan there is a seed (checked above), which mypy cannot see
            c = made[label] = Choices.seeded(seed, label) if plan is None else plan.choices(label)  # type: ignore[arg-type]
            return c

        late = Choices.seeded(seed, "late") if plan is None else plan.late_choices()  # type: ignore[arg-type]
        root = make("run")
        caps = self.capabilities if self.capabilities is not None else Capabilities(root.below(16) ^ 15)
        lo, hi = self.prompt_tokens
        vocab, eos = self.tokenizer.vocab_size, self.tokenizer.eos_token_id
        prompt = [t if t != eos else (t + 1) % vocab for t in (root.below(vocab) for _ in range(lo + root.below(hi - lo + 1)))]
        engine = FuzzEngine(self.rt, make, late, self.settings, self.view)
        failure, reasons = None, Counter[str]()
        try:
            engine.add(self.rt.new_request(self.controller, self.arg, caps), prompt, "0")
            if engine.tracks[0].finished:
                failure = self._failure(seed, "error", engine.tracks[0], engine.tracks[0].error, engine, caps, prompt)
            while failure is None and engine.live and engine.steps < max_steps:
                for t in engine.step():
                    failure = failure or self._judge(seed, t, engine, caps, prompt)
        except Violation as v:
            t = next((x for x in engine.tracks if x.label == v.label), engine.tracks[0])
            failure = self._failure(seed, "violation", t, v.message, engine, caps, prompt)
        finally:
            engine.close()
        for t in engine.tracks:
            reasons[t.finish_reason or "budget"] += 1
        recorded = Plan({k: c.drawn for k, c in made.items()}, late.drawn)
        if failure is not None:
            failure.plan = recorded
        return RunResult(seed, recorded, failure, {t.label: t.trace for t in engine.tracks}, reasons,
                         engine.steps, sum(t.calls for t in engine.tracks), caps,
                         engine.communicating)

    def _judge(self, seed: int | None, t: Track, engine: FuzzEngine, caps: Capabilities,
               prompt: list[int]) -> FuzzFailure | None:
        if t.finish_reason == "error":
            return self._failure(seed, "error", t, t.error, engine, caps, prompt)
        if self.check is None:
            return None
        done = Finished(t.label, list(t.tokens), t.generated, self._text(t),
                        t.finish_reason, t.logs)  # type: ignore[arg-type]  # finished: it has a reason
        try:
            verdict = self.check(done)
        except AssertionError as e:
            verdict = str(e) or False
        if verdict is None or verdict is True:
            return None
        message = f"check failed: {verdict}" if verdict is not False else "check failed"
        return self._failure(seed, "check", t, message, engine, caps, prompt)

    def _text(self, t: Track) -> bytes:
        return bytes(self.tokenizer.decode_bytes(t.generated))

    def _failure(self, seed: int | None, kind: str, t: Track, message: str | None, engine: FuzzEngine,
                 caps: Capabilities, prompt: list[int]) -> FuzzFailure:
        return FuzzFailure(seed, kind, t.label, message or "", engine.steps, t.calls, list(t.trace), Plan(),
                           list(prompt), caps, self._text(t), t.logs)

    def assert_plan(self, plan: Plan, max_steps: int = 100) -> RunResult:
        """Run `plan` (e.g. from the Hypothesis strategy `plans()`); AssertionError on a failure."""
        res = self.run(plan=plan, max_steps=max_steps)
        if res.failure is not None:
            raise AssertionError(str(res.failure))
        return res

    # -- many runs -----------------------------------------------------------------------------
    def fuzz(self, steps: int = 2000, seed: int = 0, time_s: float | None = None, *, shrink: bool = True,
             reproducer_dir: str | os.PathLike[str] | None = None, max_steps_per_run: int = 100, replay_every: int = 10,
             progress: Callable[[int], None] | None = None) -> FuzzReport:
        """Runs with seeds `seed, seed + 1, ...` until `steps` engine steps (or `time_s` seconds)
        are done or one fails; that failure is shrunk and, given `reproducer_dir`, written there.
        Every `replay_every`-th run is run twice to check the same seed gives the same trace."""
        report = FuzzReport()
        t0 = time.perf_counter()
        run_seed = seed
        while report.steps < steps and (time_s is None or time.perf_counter() - t0 < time_s):
            res = self.run(seed=run_seed, max_steps=min(max_steps_per_run, steps - report.steps))
            if res.failure is None and replay_every and report.runs % replay_every == 0:
                res.failure = self._replay_differs(res)
            report.runs += 1
            report.steps += res.steps
            report.calls += res.calls
            report.finish_reasons.update(res.finish_reasons)
            if progress:
                progress(res.steps)
            if res.failure is not None:
                failure = res.failure
                if shrink and failure.kind != "nondeterministic":
                    from .shrink import shrink as shrink_failure
                    failure = shrink_failure(self, failure, max_steps=2 * res.steps + 20)
                if reproducer_dir is not None:
                    from .reproducer import write_reproducer
                    failure.reproducer = str(write_reproducer(reproducer_dir, self, failure))
                report.failures.append(failure)
                break
            run_seed += 1
        report.elapsed_s = time.perf_counter() - t0
        return report

    def _replay_differs(self, res: RunResult) -> FuzzFailure | None:
        """Late calls can cost a replay steps (never change what a sequence does), so one run
        may get further than the other: each sequence's traces must agree as far as both go.
        Runs in which a sequence set a variable its request's other sequences could read are not
        compared: which fork reads whose value first depends on the workers' timing (the caller
        may run one row while a worker runs another), and docs/protocol.md#semantics allows that."""
        again = self.run(seed=res.seed, max_steps=2 * res.steps + 20)
        if res.communicating or again.communicating:
            return None       # forks that talk through variables may legitimately race
        for label in sorted(res.traces.keys() & again.traces.keys()):
            first, second = res.traces[label], again.traces[label]
            n = min(len(first), len(second))
            if first[:n] != second[:n]:
                at = next(i for i in range(n) if first[i] != second[i])
                message = (f"the same seed gave a different trace: result {at} was {first[at]} then {second[at]} "
                           "(does the controller depend on time, or on another fork's variables?)")
                return FuzzFailure(res.seed, "nondeterministic", label, message, res.steps, at, first[:at + 1],
                                   res.plan, [], Capabilities.NONE, b"", "")
        return None


def fuzz(controller: Any, arg: bytes | str = b"", *, steps: int = 2000, seed: int = 0, time_s: float | None = None,
         reproducer_dir: str | os.PathLike[str] | None = None, shrink: bool = True, **options: Any) -> FuzzReport:
    """One call: a Fuzzer over `controller` (options as for :class:`Fuzzer`), then `fuzz()`."""
    with Fuzzer(controller, arg, **options) as fz:
        return fz.fuzz(steps, seed, time_s, shrink=shrink, reproducer_dir=reproducer_dir)
