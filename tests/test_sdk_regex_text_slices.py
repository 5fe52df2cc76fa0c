"""Text-mode regexes (`.`, `[^...]`, \\S: one whole UTF-8 character past ASCII) take UTF-8 slices:
the tokens made of whole characters, the ASCII ones in a set A (aici_trie_utf8_slice), wholesale
where the DFA provably keeps every such string live (aici_utf8_covers), and a walk of the other
tokens' trie. The masks must be the whole-trie walk's, bit for bit, on every kind of vocabulary:
byte-level BPE (GPT-2, Qwen2: tokens that end inside a character) and SentencePiece with byte
fallback (Llama 2: <0xNN> tokens and one byte string under two ids).
"""
from __future__ import annotations

import functools
import random
import zlib

import numpy as np
import pytest

import _require as require

require.module("regex")
from _sdk_host import MiniHost
from _vocabs import gpt2_token_bytes, llama2_token_bytes, qwen_token_bytes
from aicirt.build.toolchain import build_cached

VOCABS = {"gpt2": gpt2_token_bytes, "qwen": qwen_token_bytes, "llama2": llama2_token_bytes}


@functools.cache
def regex_wasm() -> bytes:
    return build_cached("regex").read_bytes()


@functools.cache
def vocab(name: str):
    toks, eos = VOCABS[name]()
    whole = np.array([bool(b) and _utf8(b) for b in toks])
    return toks, eos, whole


def _utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


class Walker:
    """One controller instance stepped token by token (no re-tokenizing: any live token goes)."""

    def __init__(self, pattern: bytes, name: str, options: bytes, run_init: bool = False):
        toks, eos, _ = vocab(name)
        self.host = MiniHost(regex_wasm(), toks, eos, lambda s: [], arg=pattern + b"\0nocache" + options,
                             run_init=run_init)
        self.branches = self.host.step([1, 2, 3])

    def step(self, t: int):
        self.branches = self.host.step([t], sampled=t)

    def mask(self):
        return self.branches[0].mask if self.branches else None


def walk_both(pattern: bytes, name: str, rng: random.Random, steps: int,
              options: bytes = b"\0slicesnow\0logslice", run_init: bool = False) -> list[bool]:
    """Steps a sliced and a whole-trie session along random allowed tokens (half of the picks a
    token that is not whole UTF-8, where one is allowed); their masks must agree at every step.
    Returns, per mask, whether it took a slice. run_init: the sliced one runs the controller's
    init (the SDK's standard slices, as a Runtime's snapshot has them)."""
    toks, eos, whole = vocab(name)
    sliced = Walker(pattern, name, options, run_init)
    plain = Walker(pattern, name, b"\0noslices")
    took = []
    for k in range(steps + 1):
        a, b = sliced.mask(), plain.mask()
        assert (a is None) == (b is None), (pattern, name, k)
        if a is None:
            break
        assert (a == b).all(), (pattern, name, k, sorted(sliced.branches[0].allowed() ^ plain.branches[0].allowed())[:20])
        took.append(any("slice of" in line for line in sliced.host.logs[-1:]))
        allowed = sorted(plain.branches[0].allowed() - {eos})
        if not allowed or k == steps:
            break
        broken = [t for t in allowed if not whole[t]]
        t = rng.choice(broken if broken and rng.random() < 0.5 else allowed)
        sliced.step(t), plain.step(t)
    return took


@pytest.mark.parametrize("name", VOCABS)
@pytest.mark.parametrize("pattern", [rb'[^"]*"', rb'"[^"]*"', rb'(?:[^"\\]|\\.)*"', rb"\S+ end"])
def test_text_slices_equal_whole_trie_and_are_taken(name, pattern):
    took = walk_both(pattern, name, random.Random(zlib.crc32(name.encode() + pattern)), 6)
    if not pattern.startswith(b'"'):   # the first mask's state covers the UTF-8 slice
        assert any(took), (pattern, name)   # the point: these states no longer walk the whole trie


PIECES = [rb".", rb"[^\"]", rb"[^a-z]", rb"\S", rb"\W", rb"[a-z]", rb"[^\x00-\x7f]", "é".encode(), "中".encode(),
          rb" ", rb"x", rb"[0-9]", rb'"']
QUANTS = [b"", b"*", b"+", b"?", b"{0,12}", b"{2,40}", b"*"]


def random_pattern(rng: random.Random) -> bytes:
    parts = []
    for _ in range(rng.randint(1, 4)):
        atom = rng.choice(PIECES)
        if rng.random() < 0.3:
            atom = b"(?:" + atom + b"|" + rng.choice(PIECES) + b")"
        parts.append(atom + rng.choice(QUANTS))
    return b"".join(parts)


@pytest.mark.parametrize("name", VOCABS)
@pytest.mark.parametrize("seed", range(4))
def test_random_text_regexes_slices_equal_whole_trie(name, seed):
    rng = random.Random(seed * 7919 + len(name))
    for _ in range(3):
        walk_both(random_pattern(rng), name, rng, 5)


# Python's answer on the same language written out in bytes (one well-formed multi-byte
# character, RFC 3629, beside the ASCII part), on texts that end at and inside a character.
UTF8 = (rb"(?:[\xc2-\xdf][\x80-\xbf]|\xe0[\xa0-\xbf][\x80-\xbf]|[\xe1-\xec\xee\xef][\x80-\xbf]{2}"
        rb"|\xed[\x80-\x9f][\x80-\xbf]|\xf0[\x90-\xbf][\x80-\xbf]{2}|[\xf1-\xf3][\x80-\xbf]{3}"
        rb"|\xf4[\x80-\x8f][\x80-\xbf]{2})")


@pytest.mark.parametrize("text", [b"", "caf\u00e9 \u4e2d".encode(), "\u4e2d".encode()[:2], b"ab\xf0\x9f"])
def test_text_slice_masks_are_pythons(text):
    import regex
    toks, eos, _ = vocab("gpt2")
    ref = rb'(?:[^"\x80-\xff]|' + UTF8 + rb')*"'
    w = Walker(rb'[^"]*"', "gpt2", b"\0slicesnow\0logslice")
    for b in text:                     # byte by byte: every byte is a GPT-2 token
        w.step(toks.index(bytes([b])))
    assert "slice of" in w.host.logs[-1] or text[-1:] >= b"\x80"
    want = {i for i, b in enumerate(toks) if b and regex.fullmatch(ref, text + b, partial=True)}
    assert w.branches[0].allowed() - {eos} == want
