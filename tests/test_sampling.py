"""Bitmask apply (AICI/xgrammar layout) and seeded sampling."""
from __future__ import annotations

import numpy as np
import pytest
from aicirt.engine.sampling import SamplingParams, allowed_tokens, apply_masks, sample


def mask_of(tokens, vocab):
    m = np.zeros((vocab + 31) // 32, dtype=np.uint32)
    for t in tokens:
        m[t // 32] |= np.uint32(1 << (t % 32))
    return m


@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 257, 49152])
def test_allowed_tokens_matches_the_bit_layout(vocab):
    rng = np.random.default_rng(vocab)
    toks = sorted(set(rng.integers(0, vocab, size=min(vocab, 20)).tolist()))
    allowed = allowed_tokens(mask_of(toks, vocab)[None, :], vocab)
    assert allowed.shape == (1, vocab) and np.flatnonzero(allowed[0]).tolist() == toks


def test_apply_masks_sets_disallowed_to_minus_inf():
    logits = np.arange(2 * 70, dtype=np.float32).reshape(2, 70)
    masks = np.stack([mask_of([3, 64], 70), mask_of([69], 70)])
    apply_masks(logits, masks)
    assert np.isfinite(logits[0]).nonzero()[0].tolist() == [3, 64]
    assert np.isfinite(logits[1]).nonzero()[0].tolist() == [69]
    assert logits[1, 69] == 139


def test_greedy_and_errors():
    rng = np.random.default_rng(0)
    assert sample(np.array([0, 5, 1], dtype=np.float32), 0.0, rng) == 1
    with pytest.raises(ValueError, match="no token"):
        sample(np.full(4, -np.inf, dtype=np.float32), 0.0, rng)
    with pytest.raises(ValueError, match="no token"):
        sample(np.full(4, -np.inf, dtype=np.float32), 1.0, rng)


def test_temperature_top_k_top_p():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    draws = lambda **kw: {sample(logits, 1.0, np.random.default_rng(i), **kw) for i in range(300)}
    assert draws() == {0, 1, 2, 3}
    assert draws(top_k=2) == {0, 1}
    assert draws(top_p=0.7) == {0, 1}
    assert draws(top_p=0.5) == {0}
    masked = logits.copy()
    masked[0] = -np.inf
    assert 0 not in {sample(masked, 5.0, np.random.default_rng(i)) for i in range(100)}


def test_seeded_sampling_is_reproducible():
    logits = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    a = [sample(logits, 1.0, np.random.default_rng(7)) for _ in range(5)]
    b = [sample(logits, 1.0, np.random.default_rng(7)) for _ in range(5)]
    assert a == b


@pytest.mark.parametrize("kw", [{"temperature": -1}, {"top_p": 0}, {"top_k": -1}, {"max_tokens": 0}])
def test_params_validation(kw):
    with pytest.raises(ValueError):
        SamplingParams(**kw)


def test_one_set_of_sampling_defaults():
    """SamplingParams holds the defaults; the library entry points take theirs from it and the
    CLI's options (whose help shows them without importing the engine) agree with it."""
    import inspect

    import cli
    from aicirt.runner import run as run_command
    from aicirt.engine import SamplingParams
    from aicirt.program import run as program_run   # the function (the package re-exports it)
    d = SamplingParams()
    lib = inspect.signature(run_command.run).parameters
    assert {k: lib[k].default for k in ("max_tokens", "temperature", "top_p", "top_k")} == \
        {"max_tokens": d.max_tokens, "temperature": d.temperature, "top_p": d.top_p, "top_k": d.top_k}
    prog = inspect.signature(program_run).parameters
    assert (prog["temperature"].default, prog["top_p"].default, prog["top_k"].default) == (d.temperature, d.top_p, d.top_k)
    opts = {p.name: p.default for p in cli.main.commands["run"].params}
    assert (opts["max_tokens"], opts["temperature"], opts["top_p"], opts["top_k"]) == \
        (d.max_tokens, d.temperature, d.top_p, d.top_k)
