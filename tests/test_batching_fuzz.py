"""The transformers backend batches any legal mix: each sequence gets the greedy tokens it gets alone.

A batch can hold sequences with empty caches (a new prompt, even of one token) beside running
ones, prompts as long as another sequence's fast-forward, backtracks, forks. The default suite runs
a tiny random-weight Llama built from a seed (milliseconds a forward); `slow` runs SmolLM2.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

import aicirt
from aicirt.engine import Engine, SamplingParams
from scripted import branch, noop, result, script, splice

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from aicirt.engine.backends.transformers_backend import TransformersBackend  # noqa: E402

EOS = 256
ANY = list(range(256))     # a mask allowing every byte token (the model's greedy pick among them)


class TinyLlama(TransformersBackend):
    """A 2-layer random-weight Llama over the byte tokenizer (257 tokens, EOS 256), float32.

    The weights are drawn wider than transformers' default (0.02) so the logits spread out and
    greedy decoding has no near-ties that float rounding could flip."""

    name = "tiny-llama"

    def __init__(self, seed: int = 0) -> None:
        torch.set_grad_enabled(False)
        torch.manual_seed(seed)
        config = transformers.LlamaConfig(
            vocab_size=257, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
            initializer_range=0.5, eos_token_id=EOS, bos_token_id=0, pad_token_id=EOS)
        self._adopt(transformers.LlamaForCausalLM(config).to(torch.float32))
        self.eos_token_id = EOS
        self._byte_tokenizer = aicirt.ByteTokenizer()

    def runtime_tokenizer(self):
        return self._byte_tokenizer

    def encode(self, text):
        return list(text.encode())

    def decode_bytes(self, tokens):
        return bytes(t for t in tokens if t < 256)


@pytest.fixture(scope="module")
def tiny():
    return TinyLlama(seed=1)


def greedy(logits: np.ndarray) -> list[int]:
    return [int(t) for t in np.argmax(logits, axis=-1)]


def alone(backend, tokens: list[int]) -> np.ndarray:
    """The logits after `tokens`, from one forward over a fresh cache."""
    cache = backend.new_cache()
    try:
        return backend.forward([(cache, tokens)])[0]
    finally:
        backend.free(cache)


# --- the crash: an empty cache beside a running one ---------------------------------------------
def test_one_token_prompt_beside_a_decoding_sequence(tiny):
    running, new = tiny.new_cache(), tiny.new_cache()
    tiny.forward([(running, [5, 6, 7, 8])])
    out = tiny.forward([(running, [9]), (new, [42])])
    assert (running.length, new.length) == (5, 1)
    np.testing.assert_allclose(out[0], alone(tiny, [5, 6, 7, 8, 9]), atol=1e-4)
    np.testing.assert_allclose(out[1], alone(tiny, [42]), atol=1e-4)
    # both caches go on correctly from there, batched again
    out = tiny.forward([(new, [43]), (running, [10])])
    np.testing.assert_allclose(out[0], alone(tiny, [42, 43]), atol=1e-4)
    np.testing.assert_allclose(out[1], alone(tiny, [5, 6, 7, 8, 9, 10]), atol=1e-4)


def test_prompt_as_long_as_another_sequences_fast_forward(tiny):
    running, new, fresh = tiny.new_cache(), tiny.new_cache(), tiny.new_cache()
    tiny.forward([(running, [1, 2, 3])])
    out = tiny.forward([(running, [4, 5, 6]), (new, [7, 8, 9]), (fresh, [10, 11, 12])])
    for row, toks in zip(out, ([1, 2, 3, 4, 5, 6], [7, 8, 9], [10, 11, 12])):
        np.testing.assert_allclose(row, alone(tiny, toks), atol=1e-4)
    assert [c.length for c in (running, new, fresh)] == [6, 3, 3]


# --- the backend, fuzzed: random operations, random batches ---------------------------------------
def backend_fuzz(backend, seed: int, rounds: int = 12) -> int:
    """Random streams (new prompts of 1-9 tokens, greedy steps, fast-forwards, backtracks, forks),
    each round a random subset of them in one forward; every row's logits and greedy token must
    equal that sequence's tokens forwarded alone. Returns how many rows were checked."""
    rng = random.Random(seed)
    vocab = min(backend.vocab_size, 256)
    streams: list[tuple[object, list[int]]] = []  # (cache, tokens it holds)
    checked = 0
    try:
        for _ in range(rounds):
            batch, expect = [], []
            # a couple of new sequences (empty caches) most rounds
            for _ in range(rng.choice([0, 1, 1, 2])):
                streams.append((backend.new_cache(), []))
            if streams and rng.random() < 0.3:  # fork one that has a cache
                grown = [s for s in streams if s[1]]
                if grown:
                    c, toks = rng.choice(grown)
                    streams.append((backend.fork(c), list(toks)))
            picked = rng.sample(range(len(streams)), k=min(len(streams), rng.randint(1, 5)))
            for i in picked:
                cache, toks = streams[i]
                if toks and rng.random() < 0.3:  # backtrack, then forward at least one token
                    keep = rng.randint(0, len(toks) - 1)
                    backend.backtrack(cache, keep)
                    del toks[keep:]
                q = rng.choice([1, 1, 1, 2, 3, 5, 9]) if toks else rng.choice([1, 1, 2, 3, 5, 9])
                new = [rng.randrange(vocab) for _ in range(q)]
                toks.extend(new)
                batch.append((cache, new))
                expect.append(list(toks))
            out = backend.forward(batch)
            for row, toks, (cache, _) in zip(out, expect, batch):
                ref = alone(backend, toks)
                assert cache.length == len(toks)
                assert greedy(row[None]) == greedy(ref[None]), (seed, toks)
                assert np.abs(row - ref).max() < 1e-3, (seed, toks)
                checked += 1
    finally:
        for cache, _ in streams:
            backend.free(cache)
    return checked


@pytest.mark.parametrize("seed", range(8))
def test_backend_batches_any_mix_like_each_alone(tiny, seed):
    assert backend_fuzz(tiny, seed) >= 12


# --- the engine, fuzzed: requests arriving mid-run, controllers fast-forwarding ------------------
def random_request(rng: random.Random) -> dict:
    """A prompt of 1-9 tokens, a start step, and a script of free samples, no-ops and
    fast-forwards (some as long as another request's prompt, some with a backtrack of the token
    just sampled)."""
    steps = []
    for _ in range(rng.randint(1, 6)):
        roll = rng.random()
        if roll < 0.15:
            steps.append(noop())          # this step samples nothing: the cache stays as it is
        elif roll < 0.5:
            steps.append(result(branch(mask=ANY)))  # sample freely
        else:
            ff = [rng.randrange(256) for _ in range(rng.choice([1, 2, 3, 5, 9]))]
            steps.append(result(branch(splices=[splice(backtrack=rng.choice([0, 0, 1]), ff=ff)])))
    steps.append(result(branch(mask=ANY)))  # the last step repeats: sample until max_tokens
    return {
        "prompt": [rng.randrange(256) for _ in range(rng.choice([1, 1, 2, 3, 5, 9]))],
        "start": rng.choice([0, 0, 1, 2, 3, 5]),
        "script": script(*steps),
        "controlled": rng.random() < 0.8,
        "max_tokens": rng.randint(3, 12),
    }


def run_engine(backend, runtime, ctrl, specs: list[dict]) -> list[tuple[list[int], str | None, str | None]]:
    """Run `specs` in one engine (each added at its start step); each request's tokens and finish."""
    engine = Engine(backend, runtime)
    reqs: list = [None] * len(specs)
    step = 0
    while step < 200:
        for i, spec in enumerate(specs):
            if spec["start"] == step:
                reqs[i] = engine.add_request(
                    spec["prompt"], ctrl if spec["controlled"] else None,
                    spec["script"] if spec["controlled"] else b"",
                    params=SamplingParams(max_tokens=spec["max_tokens"]))
        if step > max(s["start"] for s in specs) and not engine.has_unfinished:
            break
        engine.step()
        step += 1
    assert not engine.has_unfinished
    engine.close()
    return [(r.sequences[0].tokens, r.sequences[0].finish_reason, r.sequences[0].error) for r in reqs]


def engine_fuzz(backend, runtime, scripted_wasm, seed: int) -> int:
    rng = random.Random(seed)
    specs = [random_request(rng) for _ in range(rng.randint(3, 6))]
    ctrl = runtime.load(scripted_wasm)
    together = run_engine(backend, runtime, ctrl, specs)
    for spec, got in zip(specs, together):
        by_itself = run_engine(backend, runtime, ctrl, [dict(spec, start=0)])[0]
        assert got == by_itself, (seed, spec["prompt"], got, by_itself)
    errors = [err for (_, reason, err) in together if reason == "error"]
    assert not errors, errors          # every script is legal: a failure here is the engine's
    generated = sum(len(toks) - len(spec["prompt"]) for spec, (toks, _, _) in zip(specs, together))
    return generated


@pytest.mark.parametrize("seed", range(6))
def test_engine_batches_any_mix_like_each_alone(tiny, runtime, scripted_wasm, seed):
    assert engine_fuzz(tiny, runtime, scripted_wasm, seed) > 0


# --- the real model -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smol():
    from aicirt.engine.backends import load_backend

    try:
        return load_backend(None, dtype="float32")
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_smollm2_batches_any_mix_like_each_alone(smol, seed):
    assert backend_fuzz(smol, seed, rounds=8) >= 8


@pytest.mark.slow
def test_smollm2_engine_batches_any_mix_like_each_alone(smol, scripted_wasm):
    rt = aicirt.Runtime(smol.runtime_tokenizer(), limits=aicirt.Limits(soft_deadline_s=5.0), cache_dir=False)
    try:
        assert engine_fuzz(smol, rt, scripted_wasm, seed=0) > 0
    finally:
        rt.close()
