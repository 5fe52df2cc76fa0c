"""The SDK's standard slices (aici_trie_std_slices: a-z, A-Za-z, \\w and five UTF-8 slices, made
by the regex controller's init and so in its snapshot) serve a regex's masks from the first one,
wherever they lie within the pattern's repeated sets and the DFA keeps all their strings live;
the pattern's own slices come only once its walks have visited 4 whole tries' worth of nodes.
Every mask must equal the whole-trie walk's, bit for bit, on byte-level BPE (GPT-2, Qwen2) and
SentencePiece with byte fallback (Llama 2)."""
from __future__ import annotations

import random
import zlib

import pytest

import _require as require

require.module("regex")
from test_sdk_regex_text_slices import VOCABS, random_pattern, walk_both  # noqa: E402

DEFAULT = b"\0logslice"               # the default ski rental, as a request runs it

# (pattern, whether its first mask's state lies inside a standard slice)
PATTERNS = [
    (rb"[a-zA-Z_][a-zA-Z0-9_]*", True),    # A-Za-z covers the start (then any \w)
    (rb"[a-z0-9._]+@[a-z0-9]+\.(com|org|net)", True),
    (rb'[^"]*"', True),
    (rb"\w+", False),                      # \w is Unicode over text: no byte set holds it
    (rb"[a-z ]+", True),
    (rb".*", True),
    (rb'"(?:[^"\\]|\\.)*"', False),        # the opening quote first
    (rb"[0-9]{4}-[0-9]{2}", False),        # no standard slice within [0-9]
]


@pytest.mark.parametrize("name", VOCABS)
@pytest.mark.parametrize("pattern,first", PATTERNS)
def test_standard_slices_equal_whole_trie_from_the_first_mask(name, pattern, first):
    took = walk_both(pattern, name, random.Random(zlib.crc32(name.encode() + pattern)), 8,
                     options=DEFAULT, run_init=True)
    assert took
    if first:                          # the point: no whole-trie walk, no slice of its own built
        assert took[0], (pattern, name, took)


@pytest.mark.parametrize("name", VOCABS)
def test_without_the_init_the_first_masks_walk_the_whole_trie(name):
    took = walk_both(rb"[a-zA-Z_][a-zA-Z0-9_]*", name, random.Random(1), 3, options=DEFAULT)
    assert not any(took), took         # no standard slices made, and the rent not yet paid


@pytest.mark.parametrize("name", VOCABS)
@pytest.mark.parametrize("seed", range(3))
def test_random_regexes_standard_slices_equal_whole_trie(name, seed):
    rng = random.Random(seed * 104729 + len(name))
    for _ in range(3):
        walk_both(random_pattern(rng), name, rng, 6, options=DEFAULT, run_init=True)


def _slice_tokens(log: list[str]) -> int:
    """Tokens of the slice the last mask took (its `logslice` line), 0 for a whole-trie walk."""
    line = log[-1]
    return int(line.split("slice of ")[1].split()[0]) if "slice of" in line else 0


@pytest.mark.parametrize("name", VOCABS)
def test_own_slices_still_built_beside_the_standard_ones(name):
    """The standard slices stay outside the SDK's node budget: a pattern's own slice (here
    [a-z0-9._], larger than the standard a-z) is still built once the rent is paid (slicesnow:
    at once), and taken over the smaller standard one."""
    from test_sdk_regex_text_slices import Walker
    pattern = rb"[a-z0-9._]+@[a-z0-9]+\.(com|org|net)"
    std = Walker(pattern, name, b"\0logslice", run_init=True)
    own = Walker(pattern, name, b"\0slicesnow\0logslice", run_init=True)
    assert (std.mask() == own.mask()).all()
    assert 0 < _slice_tokens(std.host.logs) < _slice_tokens(own.host.logs), (std.host.logs[-1:], own.host.logs[-1:])
