"""MaskBench conformance of the `json` controller (JSONSchemaBench cases in tests/data/jsonschema).

For every schema: either a clean "unsupported: KEYWORD at POINTER" error, or every valid instance
is accepted token by token under the masks and may end there, and every invalid one is rejected
at some token or cannot end. The default run takes a sample of each slice with Qwen2's tokens;
`-m slow` sweeps every case. Also: documents sampled under the masks from random logits validate
with `jsonschema`.
"""
from __future__ import annotations

import re

import jsonschema  # noqa: F401  (the dev extra installs it; a missing one fails, never skips)
import pytest

from _json_cases import (SLICES, Checker, VocabTokenizer, check_case, load_slice, sample,
                         sampled_documents_validate)
from _vocabs import qwen_token_bytes
from aicirt.build.toolchain import build_cached

ERROR = re.compile(r"^json: (unsupported: \S+ at #\S*|bad schema: .+|the schema admits no document)")


@pytest.fixture(scope="module")
def checker():
    vocab, eos = qwen_token_bytes()
    c = Checker(VocabTokenizer(vocab, eos), build_cached("json").read_bytes())
    yield c
    c.close()


def _check(checker, case):
    r = check_case(checker, case)
    if r["error"] is not None:
        assert ERROR.match(r["error"]), (case["id"], r["error"])
        return
    bad_valid = [t for ok, t in r["valid"] if not ok]
    bad_invalid = [t for ok, t in r["invalid"] if ok]
    assert not bad_valid, (case["id"], "valid instance rejected", bad_valid[:2])
    assert not bad_invalid, (case["id"], "invalid instance accepted", bad_invalid[:2])


@pytest.mark.parametrize("slice_name", SLICES)
def test_maskbench_sample(checker, slice_name):
    for case in sample(slice_name, 8, seed=1):
        _check(checker, case)


@pytest.mark.slow
@pytest.mark.parametrize("slice_name", SLICES)
def test_maskbench_every_case(checker, slice_name):
    for case in load_slice(slice_name):
        _check(checker, case)


# -- documents sampled under the masks ----------------------------------------------------------
# (the default run samples under masks in test_json_schema.py's keyword combinations; these
# MaskBench schemas took ~20 s of it)
@pytest.mark.slow
def test_sampled_documents_validate(checker):
    cases = [c for s in SLICES[:3] for c in sample(s, 2, seed=2)]
    assert sampled_documents_validate(checker, cases, per_schema=1) >= 3


@pytest.mark.slow
def test_sampled_documents_validate_many(checker):
    cases = [c for s in SLICES for c in sample(s, 60, seed=3)]
    assert sampled_documents_validate(checker, cases) >= 200


@pytest.fixture(scope="module")
def smollm2_checker():
    pytest.importorskip("transformers")
    from aicirt.engine.backends import load_backend
    try:
        backend = load_backend(None)
    except FileNotFoundError as e:
        pytest.skip(str(e))
    tok = backend.runtime_tokenizer()
    c = Checker(VocabTokenizer(list(tok.token_bytes), tok.eos_token_id), build_cached("json").read_bytes())
    yield c
    c.close()


@pytest.mark.slow
@pytest.mark.parametrize("slice_name", SLICES)
def test_maskbench_sample_smollm2(smollm2_checker, slice_name):
    """The default model's own tokenizer (SmolLM2, 49k tokens)."""
    for case in sample(slice_name, 25, seed=4):
        _check(smollm2_checker, case)
