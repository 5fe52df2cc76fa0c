"""MaskBench conformance of the `json` controller (JSONSchemaBench cases in ../shared/jsonschema).

For every schema: either a clean "unsupported: KEYWORD at POINTER" error, or every valid instance
is accepted token by token under the masks and may end there, and every invalid one is rejected
at some token or cannot end. The default run takes a sample of each slice with Qwen2's tokens;
`-m slow` sweeps every case. Also: documents sampled under the masks from random logits validate
with `jsonschema`.
"""
from __future__ import annotations

import functools
import json
import re
import warnings

import numpy as np
import pytest

from _json_cases import SLICES, Checker, VocabTokenizer, check_case, data_dir, load_slice, sample
from _vocabs import qwen_token_bytes
from aicirt.toolchain import build_cached

pytestmark = pytest.mark.skipif(not data_dir().is_dir(), reason="no ../shared/jsonschema test cases here")
ERROR = re.compile(r"^json: (unsupported: \S+ at #\S*|bad schema: .+|the schema admits no document)")
jsonschema = pytest.importorskip("jsonschema")


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
def _sample_document(checker, handle, rng, max_tokens=150, closing_after=20):
    """Random logits, sampled under the masks; past `closing_after` tokens, tokens that close
    something (quotes, brackets, EOS) are preferred so that most documents end. None if
    unfinished."""
    req, seq = handle
    vocab, eos = checker.tok.token_bytes, checker.tok.eos_token_id
    child = seq.fork()
    toks: list[int] = []
    try:
        r, mask = checker._submit(child, [], None, record=False)
        for _ in range(max_tokens):
            if not r.branches:
                return b"".join(vocab[t] for t in toks)
            if mask is None:       # fast-forward: take the splice
                sp = r.branches[0].splices[0]
                toks = toks[:len(toks) - sp.backtrack] + list(sp.ff_tokens)
                r, mask = checker._submit(child, toks, None, record=False)
                continue
            allowed = np.nonzero(np.unpackbits(mask.view(np.uint8), bitorder="little"))[0]
            if len(toks) > closing_after:
                closing = [t for t in allowed if t == eos or (vocab[t][:1] in (b'"', b"]", b"}", b","))]
                allowed = closing or allowed
            t = int(rng.choice(allowed))
            if t == eos:
                return b"".join(vocab[t] for t in toks)
            toks.append(t)
            r, mask = checker._submit(child, toks, t, record=False)
        return None
    finally:
        child.close()


def _sampled_documents_validate(checker, cases, per_schema=2):
    import jsonschema
    rng = np.random.default_rng(0)
    done = 0
    for case in cases:
        handle, err, _ = checker.open(case["schema"])
        try:
            if err is not None:
                continue
            for _ in range(per_schema):
                doc = _sample_document(checker, handle, rng)
                if doc is None:
                    continue
                data = json.loads(doc.decode("utf-8"))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    cls = jsonschema.validators.validator_for(case["schema"])
                    errors = list(cls(case["schema"]).iter_errors(data))
                assert not errors, (case["id"], doc[:300], errors[0].message[:200])
                done += 1
        finally:
            checker.close_handle(handle)
    return done


def test_sampled_documents_validate(checker):
    cases = [c for s in SLICES[:3] for c in sample(s, 2, seed=2)]
    assert _sampled_documents_validate(checker, cases, per_schema=1) >= 3


@pytest.mark.slow
def test_sampled_documents_validate_many(checker):
    cases = [c for s in SLICES for c in sample(s, 60, seed=3)]
    assert _sampled_documents_validate(checker, cases) >= 200


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
