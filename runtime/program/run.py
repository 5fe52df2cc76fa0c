"""`run(program, prompt=..., model=...)`: a program on the embedded engine, no server.

It is `aicirt run program` as a function, over the engine (`aicirt.runner.run.generate`, which
prints nothing): the program is checked first by the controller's first call on the stand-in
(`aicirt.program.validate`: `ProgramError` before the model's tokenizer or weights load), then
the first call is tried on the model's tokenizer before the weights load (a refusal there, e.g. a
token text that is not one token of this model, is the same `ProgramError`), then one request runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..engine.sampling import SamplingParams   # the one set of sampling defaults
from .builder import Format
from .validate import ProgramError, argument, validate


@dataclass
class ProgramResult:
    """What a run produced. `texts[i]` is sequence i's generated text (forks: parent first),
    `variables` what the program captured (UTF-8 text; bytes that are not UTF-8 as {"hex": ...}),
    `finish_reasons[i]` why sequence i ended, `raw` the whole result of `aicirt run --json`."""
    texts: list[str]
    variables: dict[str, Any]
    finish_reasons: list[str]
    raw: dict = field(repr=False)

    @property
    def text(self) -> str:
        """The first sequence's text."""
        return self.texts[0] if self.texts else ""


def program_arg(program: Format | dict | str | bytes) -> bytes:
    """The controller's argument for `program` (a Format, its JSON object or text), checked by the
    controller's first call (`validate`). Raises `ProgramError` with the controller's message."""
    arg = argument(program.spec if isinstance(program, Format) else program)
    validate(arg)
    return arg


def run(program: Format | dict | str | bytes, *, prompt: str = "", model: str | None = None,
        max_tokens: int = 256, temperature: float = SamplingParams.temperature, seed: int | None = None,
        chat: bool = True, top_p: float = SamplingParams.top_p, top_k: int = SamplingParams.top_k) -> ProgramResult:
    """Run `program` once on `model` (as `aicirt run --model`: None is the default SmolLM2,
    "scripted" a fake model). `max_tokens` bounds each sequence. Raises `ProgramError` (the
    controller refused the program on its first call: on the stand-in, or on the model's
    tokenizer), `aicirt.runner.run.RunFailed` (a sequence ended in error), FileNotFoundError (no
    such model)."""
    from ..runner.run import RunFailed, failure, generate

    arg = program_arg(program)
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens, seed=seed)
    try:
        raw = generate("program", arg=arg, prompt=prompt, params=params, model=model, chat=chat)
    except RunFailed as e:
        refused = ProgramError.from_log(e.log) if e.result is None else None
        if refused is not None:
            raise refused from e
        raise
    why = failure(raw)
    if why is not None:
        raise RunFailed(why, raw)
    seqs = raw["sequences"]
    return ProgramResult(texts=[s["text"] for s in seqs], variables=dict(raw["variables"]),
                         finish_reasons=[s["finish_reason"] for s in seqs], raw=raw)
