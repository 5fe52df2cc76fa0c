"""Prompt-lookup speculative decoding in the own engine (aicirt.engine.speculative): greedy output
identical to the plain engine for every shipped controller, with drafts actually accepted."""
from __future__ import annotations

import numpy as np
import pytest
from test_controllers import FUZZED

from aicirt.build import toolchain
from aicirt.engine import Engine, SamplingParams
from aicirt.engine.backends.scripted import ScriptedBackend
from aicirt.engine.speculative import PromptLookup, SpeculativeEngine

PROMPT = b'Copy this: {"a": 12, "b": "red green blue", "c": [1, 2, 3]} then {"a": 12, "b": "red'
SCRIPT = list(PROMPT + b' green blue", "c": [1, 2, 3]} done. Yes red 3 2 1 liftoff! ab12')


@pytest.fixture(scope="module")
def wasm():
    return {name: str(toolchain.build_cached(name)) for name in FUZZED}


def _run(engine_cls, ctrl, arg, max_tokens=48, **kw):
    backend = ScriptedBackend(script=SCRIPT)
    eng = engine_cls(backend, **kw)
    try:
        req = eng.generate(list(PROMPT), ctrl, arg, params=SamplingParams(max_tokens=max_tokens))
        seqs = [(s.tokens, s.finish_reason, s.error, s.text_bytes) for s in req.sequences]
        return seqs, dict(req.variables) if req.ctrl is not None else {}, eng, None
    finally:
        eng.close()


def test_prompt_lookup_drafts_what_followed_the_last_ngram():
    d = PromptLookup(k=4, max_ngram=3)
    assert d([1, 2, 3, 4, 5, 9, 2, 3]) == [4, 5, 9, 2]
    assert d([1, 2, 3, 7, 2, 3, 8, 2, 3]) == [8, 2, 3]   # the latest occurrence
    assert d([5, 6, 7]) == []
    with pytest.raises(ValueError):
        PromptLookup(k=0)


@pytest.mark.parametrize("name", [None, *sorted(FUZZED)])
def test_greedy_output_is_identical_with_and_without_speculation(wasm, name):
    ctrl = None if name is None else wasm[name]
    arg = b"" if name is None else FUZZED[name][0]
    plain, plain_vars, _, _ = _run(Engine, ctrl, arg)
    spec, spec_vars, eng, _ = _run(SpeculativeEngine, ctrl, arg)
    assert spec == plain and spec_vars == plain_vars
    assert eng.spec_stats["drafted"] > 0, eng.spec_stats


def test_drafts_are_accepted_and_masked_on_a_copying_request(wasm):
    schema = b'{"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a", "b"]}'
    plain, _, plain_eng, _ = _run(Engine, wasm["json"], schema)
    spec, _, eng, _ = _run(SpeculativeEngine, wasm["json"], schema)
    assert spec == plain
    st = eng.spec_stats
    assert st["accepted"] >= 5 and st["draft_rows"] >= st["accepted"], st
    assert eng.stats.steps < plain_eng.stats.steps


def test_a_random_drafter_changes_nothing(wasm):
    rng = np.random.default_rng(0)

    def noisy(tokens):
        d = PromptLookup(k=5)(tokens)
        return [int(rng.integers(0, 256)) if rng.random() < 0.3 else t for t in d] or [int(rng.integers(0, 256))]
    for name in ("regex", "splice", "json", "choice"):
        plain, pv, _, _ = _run(Engine, wasm[name], FUZZED[name][0])
        spec, sv, _, _ = _run(SpeculativeEngine, wasm[name], FUZZED[name][0], drafter=noisy)
        assert spec == plain and sv == pv, name
