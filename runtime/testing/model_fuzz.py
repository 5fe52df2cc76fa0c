"""Fuzz a controller in your own tests: a seeded fake model drives it, and every run must keep
the contract.

    from aicirt.testing import fuzz_controller

    def test_digits_controller():
        report = fuzz_controller("digits.wasm", runs=100,
                                 check=lambda seq: seq.text_bytes.isdigit() or "not digits")
        assert report.ok, report          # on failure: the seeds and messages that reproduce it

Each run is a fresh request on `aicirt.engine.Engine` over `ScriptedBackend` with its own seed:
random prompt tokens, then sampling at temperature 1 from seeded noise, so every token the
controller allows gets a chance. A run fails when a sequence ends with finish reason "error"
(trap, time limit, invalid result, refused capability, ...) or when `check` rejects it.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..capabilities import Capabilities
from ..engine import Engine, GenSeq, SamplingParams
from ..engine.backends.scripted import ScriptedBackend
from ..limits import Limits
from ..core.runtime import Runtime
from ..host.tokenizer import ByteTokenizer

if TYPE_CHECKING:
    from ..host.tokenizer import Tokenizer

#: A property of one finished sequence: return None/True if it holds, else a message (or False).
Check = Callable[[GenSeq], "str | bool | None"]


@dataclass
class FuzzFailure:
    seed: int             # fuzz_controller(..., seed=seed, runs=1) replays this run
    sequence: int         # label of the failing sequence within the run (0 = the first; forks count up)
    message: str
    prompt: list[int]
    output: bytes
    logs: str


@dataclass
class FuzzReport:
    runs: int
    failures: list[FuzzFailure] = field(default_factory=list)
    finish_reasons: Counter = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return not self.failures

    def __str__(self) -> str:
        head = f"{self.runs} runs, {len(self.failures)} failed; finish reasons: {dict(self.finish_reasons)}"
        lines = [head] + [f"  seed {f.seed} seq #{f.sequence}: {f.message} (output {f.output[:60]!r})"
                          + (f"\n    log: {f.logs[-300:]!r}" if f.logs else "") for f in self.failures[:10]]
        return "\n".join(lines)


def fuzz_controller(controller: Any, arg: bytes | str = b"", *, runs: int = 50, seed: int = 0,
                    max_tokens: int = 48, prompt_tokens: tuple[int, int] = (1, 8),
                    tokenizer: Tokenizer | None = None, limits: Limits | None = None,
                    capabilities: Capabilities = Capabilities.ALL, temperature: float = 1.0,
                    check: Check | None = None) -> FuzzReport:
    """Run `controller` (a path, bytes or `aicirt.Controller`) `runs` times with seeds
    `seed, seed + 1, ...`; returns a FuzzReport (never raises for a misbehaving controller).

    `tokenizer` defaults to `aicirt.ByteTokenizer`; prompts are `prompt_tokens` (min, max) random
    non-EOS tokens. Raises `aicirt.LoadError` if the module is not a controller at all.
    """
    tokenizer = tokenizer or ByteTokenizer()
    report = FuzzReport(runs)
    with Runtime(tokenizer, limits=limits, workers=1, cache_dir=False) as rt:
        ctrl = controller if hasattr(controller, "sha256") else rt.load(controller)
        for run_seed in range(seed, seed + runs):
            rng = np.random.default_rng(run_seed)
            n = int(rng.integers(prompt_tokens[0], prompt_tokens[1] + 1))
            prompt = [int(t) for t in rng.integers(0, tokenizer.vocab_size, n) if t != tokenizer.eos_token_id] or [0]
            params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=run_seed)
            with Engine(ScriptedBackend(tokenizer, seed=run_seed), runtime=rt) as engine:
                req = engine.add_request(prompt, ctrl, arg, capabilities=capabilities, params=params, chat=False)
                for _ in engine.run():
                    pass
                for s in req.sequences:
                    report.finish_reasons[s.finish_reason] += 1
                    message = s.error if s.finish_reason == "error" else _verdict(check, s)
                    if message:
                        report.failures.append(FuzzFailure(run_seed, s.label, message, prompt, s.text_bytes,
                                                           "".join(s.logs)))
    return report


def _verdict(check: Check | None, s: GenSeq) -> str | None:
    if check is None:
        return None
    try:
        verdict = check(s)
    except AssertionError as e:
        return f"check failed: {e}"
    if verdict is None or verdict is True:
        return None
    return f"check failed: {verdict}" if verdict is not False else "check failed"
