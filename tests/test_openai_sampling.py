"""The engine's part of the OpenAI fields: stop strings (cut before the stop, across tokens and after a
fast-forward, held back from a stream until ruled out) and logprobs (exact under the mask, forced
tokens at probability 1). Scripted backend over the byte tokenizer: one token per byte."""
from __future__ import annotations

import json

import numpy as np
import pytest

from aicirt.engine import Engine, SamplingParams
from aicirt.engine.backends import ScriptedBackend
from aicirt.engine.sampling import find_stop, partial_stop, token_logprobs
from aicirt.serve.tracker import RunTracker

TARGET = b"Hello world. Bye"
PROMPT = b"P: "


def wants_target(tokens):
    """Prefers TARGET's next byte after the prompt, then EOS."""
    logits = np.linspace(0, 1, 257, dtype=np.float32)
    i = len(tokens) - len(PROMPT)
    logits[TARGET[i] if i < len(TARGET) else 256] += 20
    return logits


@pytest.fixture
def engine():
    with Engine(ScriptedBackend(logits_fn=wants_target)) as e:
        yield e


def run(engine, params, controller=None, arg=b""):
    req = engine.add_request(list(PROMPT), controller, arg, params=params)
    tracker = RunTracker(engine.backend, req)
    updates = []
    while not req.finished:
        u = tracker.update(engine.step())
        if u is not None:
            updates.append(u)
    return req, updates


def test_stop_string_across_tokens_cuts_the_text_before_it(engine):
    req, updates = run(engine, SamplingParams(max_tokens=40, stop=("zzz", "wor")))
    (s,) = req.sequences
    assert s.finish_reason == "stop" and s.text_bytes == b"Hello " and s.error is None
    assert bytes(s.output_tokens) == b"Hello wor"          # the tokens stay; the text is cut
    # the stream never showed a prefix of the stop: "w", "wo" were held until "wor" ended it
    assert "".join(d.text for u in updates for d in u.forks) == "Hello "
    assert all(not d.text.endswith(("w", "wo")) for u in updates for d in u.forks)


def test_a_stop_ruled_out_is_released(engine):
    req, updates = run(engine, SamplingParams(max_tokens=40, stop=("world!",)))
    assert req.sequences[0].finish_reason == "eos"
    assert "".join(d.text for u in updates for d in u.forks) == TARGET.decode()


def test_stop_completed_by_a_fast_forward(engine):
    ctrl = engine.runtime.load(_program())
    arg = json.dumps({"type": "const_string", "value": "Hello world"}).encode()
    req, _ = run(engine, SamplingParams(max_tokens=40, stop=("o w",), logprobs=1), ctrl, arg)
    (s,) = req.sequences
    assert s.finish_reason == "stop" and s.text_bytes == b"Hell"
    # forced tokens: log-probability 0 (the only choice), themselves the top alternative
    assert s.logprobs and all(lp == (0.0, ((t, 0.0),)) for t, lp in zip(s.tokens[len(PROMPT):], s.logprobs))


def test_logprobs_are_log_softmax_of_the_logits(engine):
    req, updates = run(engine, SamplingParams(max_tokens=5, logprobs=3))
    (s,) = req.sequences
    assert len(s.logprobs) == len(s.output_tokens) == 5
    for k, (lp, alts) in enumerate(s.logprobs):
        logits = wants_target(list(PROMPT) + s.output_tokens[:k]).astype(np.float64)
        ref = logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
        assert lp == pytest.approx(ref[s.output_tokens[k]]) and len(alts) == 3
        assert alts[0][0] == s.output_tokens[k] and [a for _, a in alts] == sorted((a for _, a in alts), reverse=True)
    # the stream hands each token's entry over with its text, once
    sent = [e for u in updates for d in u.forks for e in d.logprobs]
    assert [t for t, _ in sent] == s.output_tokens


def test_masked_tokens_have_no_probability():
    logits = np.array([1.0, -np.inf, 2.0, -np.inf])
    lp, alts = token_logprobs(logits, 2, 4)
    assert lp == pytest.approx(np.log(np.e ** 2 / (np.e + np.e ** 2)))
    assert [t for t, _ in alts] == [2, 0]              # the -inf ones are not alternatives


def test_stop_helpers():
    assert find_stop(b"abc def", ("de", "c")) == 2 and find_stop(b"abc", ("x",)) is None
    assert partial_stop(b"Hello wo", ("world",)) == 2 and partial_stop(b"Hello", ("world",)) == 0
    assert partial_stop(b"ab", ("abc", "bx")) == 2 and partial_stop(b"x", ("x",)) == 0   # a whole stop is found, not held
    assert partial_stop("é".encode()[:1], ("é",)) == 1


@pytest.mark.parametrize("bad", [{"stop": ("",)}, {"stop": ["x"]}, {"logprobs": 21}, {"logprobs": -1}])
def test_bad_sampling_params_raise(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def _program():
    from aicirt.build.toolchain import build_cached

    return build_cached("program")


def test_stop_check_reads_only_the_tail(engine, monkeypatch):
    # Each step's check decodes the new token and the stop's length before it (3 tokens for
    # "Bye"), not the whole output; the whole text is decoded only on the hit (the part before
    # the window) and when the sequence finishes.
    sizes = []
    real = engine.backend.decode_bytes
    monkeypatch.setattr(engine.backend, "decode_bytes", lambda toks: (sizes.append(len(toks)), real(toks))[1])
    req = engine.generate(list(PROMPT), params=SamplingParams(max_tokens=40, stop=("Bye",)))
    assert req.sequences[0].text_bytes == b"Hello world. " and req.sequences[0].finish_reason == "stop"
    assert len(sizes) > 2 * len(b"Hello world. ") and sum(n > 3 for n in sizes) == 2, sizes
