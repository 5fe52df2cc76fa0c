"""The llama.cpp backend end to end on the shipped GGUF (SmolLM2-135M-Instruct). Slow: `make
test-slow` builds llama-cpp-python (`make setup-llamacpp`) and runs it."""
from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("llama_cpp")

from aicirt.engine import Engine, SamplingParams
from aicirt.runner.run import resolve_controller

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def backend():
    from aicirt.engine.backends import load_backend
    from aicirt.engine.backends.model_files import default_gguf

    try:
        path = default_gguf()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    b = load_backend(f"llamacpp:{path}")
    yield b
    b.close()


def test_logits_are_the_models_not_zeros(backend):
    """Before: Llama.scores[n_tokens - 1] was never filled with logits_all=False: all zeros."""
    prompt = backend.encode("The capital of France is")
    cache = backend.new_cache()
    logits = backend.forward([(cache, prompt)])[0]
    assert np.isfinite(logits).all() and logits.std() > 1.0
    # a second step from the cache: the same logits as evaluating the whole list afresh
    nxt = int(logits.argmax())
    step = backend.forward([(cache, [nxt])])[0]
    fresh = backend.forward([(backend.new_cache(), prompt + [nxt])])[0]
    assert int(step.argmax()) == int(fresh.argmax())
    np.testing.assert_allclose(step, fresh, rtol=1e-3, atol=1e-2)


def test_the_same_next_token_as_the_transformers_backend(backend):
    """The same weights (the same GGUF) through transformers: the same greedy token."""
    pytest.importorskip("transformers")
    from aicirt.engine.backends import load_backend
    hf = load_backend(None)
    try:
        prompt = backend.encode("The capital of France is")
        ours = backend.forward([(backend.new_cache(), prompt)])[0]
        theirs = np.asarray(hf.forward([(hf.new_cache(), prompt)])[0], dtype=np.float32)
        assert int(ours.argmax()) == int(theirs.argmax())
    finally:
        hf.close()


def test_regex_demo_answers_1945(backend):
    with Engine(backend) as engine:
        ctrl = engine.runtime.load(resolve_controller("regex", progress=False))
        req = engine.generate("In which year did World War II end?", ctrl, "(19|20)[0-9]{2}",
                              params=SamplingParams(max_tokens=8))
    (s,) = req.sequences
    assert s.finish_reason in ("stop", "eos"), s.error
    assert re.fullmatch("(19|20)[0-9]{2}", s.text.removesuffix("<|im_end|>")) and s.text.startswith("1945"), s.text
