"""The SDK's regex constraint against Python's regex engine (bytes semantics, partial matching).

Property: after any text that is still a prefix of a match, the mask allows exactly the tokens
whose bytes keep the text a prefix of some match, plus EOS exactly when the text is a match.
"""
from __future__ import annotations

import functools

import pytest
import wasmtime

import _require as require

regex = require.module("regex")
from hypothesis import HealthCheck, given, settings, strategies as st

from _sdk_host import MiniHost
from _vocabs import gpt2_token_bytes, greedy_tokenize, qwen_token_bytes
from aicirt.build.toolchain import build_cached

BYTE_VOCAB = [bytes([i]) for i in range(256)] + [b""]
PATTERNS = [
    rb"[0-9]+",
    rb"[a-zA-Z_][a-zA-Z0-9_]*",
    rb"\d{4}-\d{2}-\d{2}",
    rb"[a-z0-9._]+@[a-z]+\.(com|org|net)",
    rb'[^"]*"',
    rb"(foo|bar)+(baz)?",
    rb"(a|b)*c{2,3}",
    rb" ?[A-Z][a-z]{0,5}( [A-Z][a-z]{0,5})*",
    rb".{0,3}end",
    rb"\s*\w+\s*",
    rb"(?:ab|a)(?:bc|c)",
    rb"[^\x00-\x7f]+",
    rb"x{0}y?",
    rb"\(\d+\)\.\*",
    rb"(true|false|null|-?\d+(\.\d+)?)",
    # the same subexpressions before the same successor (compiled once, shared) and before others
    rb"(?:ab|cd)x|(?:ab|cd)x?y|e(?:ab|cd)x",
    rb"(?:|b(?:|a(?:|s[^s]))|[^b])[a-z]*\"",
    rb"(?:[a-c]+|d)(?:[a-c]+|d){0,2}(?:[a-c]+|d)*",
]


@functools.cache
def regex_wasm() -> bytes:
    return build_cached("regex").read_bytes()


class RegexSession:
    """One controller instance, moved to any text by backtracking and re-feeding tokens."""

    def __init__(self, pattern: bytes, vocab: list[bytes], eos: int, options: bytes = b""):
        self.vocab, self.eos, self.pattern = vocab, eos, pattern
        self.host = MiniHost(regex_wasm(), vocab, eos, lambda s: [], arg=pattern + options)
        self.first = self.host.step([1, 2, 3])     # the prompt: never fed to the DFA
        self.fed = 0

    def mask_after(self, text: bytes):
        toks = greedy_tokenize(self.vocab, text) if self.vocab is not BYTE_VOCAB else list(text)
        br = self.host.step(toks, backtrack=self.fed, sampled=toks[-1] if toks else None)
        self.fed = len(toks)
        return br

    def expected(self, text: bytes) -> set[int]:
        pat = self.pattern
        allowed = {i for i, b in enumerate(self.vocab) if b and regex.fullmatch(pat, text + b, partial=True)}
        m = regex.fullmatch(pat, text, partial=True)
        if m is not None and not m.partial:
            allowed.add(self.eos)
        return allowed

    def check(self, text: bytes):
        br = self.mask_after(text)
        want = self.expected(text)
        if not br:   # stopped: only right when the text is a match that nothing can extend
            assert want <= {self.eos}, (self.pattern, text, self.host.logs)
            return
        assert len(br) == 1 and br[0].mask is not None
        got = br[0].allowed()
        assert got == want, (self.pattern, text, sorted(got ^ want)[:20], self.host.logs)


@functools.cache
def session(pattern: bytes, vocab_name: str, options: bytes = b"") -> RegexSession:
    if vocab_name == "bytes":
        vocab, eos = BYTE_VOCAB, 256
    else:
        vocab, eos = {"gpt2": gpt2_token_bytes, "qwen": qwen_token_bytes}[vocab_name]()
    return RegexSession(pattern, vocab, eos, b"\0bytes" + options)   # Python's bytes semantics


def live_prefix(pattern: bytes, text: bytes) -> bytes:
    """The longest prefix of `text` that is still a prefix of some match."""
    for k in range(len(text), -1, -1):
        if regex.fullmatch(pattern, text[:k], partial=True):
            return text[:k]
    raise AssertionError("the empty string is always a prefix of a match")  # patterns here match something


@st.composite
def prefix_of_match(draw, pattern: bytes):
    s = draw(st.from_regex(pattern, fullmatch=True).filter(lambda x: len(x) < 40))
    return s[: draw(st.integers(0, len(s)))]


FAST = settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: p.decode("latin-1"))
@pytest.mark.parametrize("options", [b"", b"\0nocache"], ids=["cached", "cold"])
@FAST
@given(data=st.data())
def test_byte_vocab_mask_matches_python(pattern, options, data):
    s = session(pattern, "bytes", options)
    text = data.draw(st.one_of(prefix_of_match(pattern), st.binary(max_size=8).map(lambda t: live_prefix(pattern, t))))
    s.check(text)


# GPT-2's 50k tokens checked against Python cost 10-30 s a pattern at load 20: the first four
# patterns in make test, the next four in make test-slow.
@pytest.mark.parametrize("pattern", [*PATTERNS[:2], *(pytest.param(p, marks=pytest.mark.slow) for p in PATTERNS[2:8])],
                         ids=lambda p: p.decode("latin-1"))
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_gpt2_mask_matches_python(pattern, data):
    session(pattern, "gpt2").check(data.draw(prefix_of_match(pattern)))


@pytest.mark.slow
@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: p.decode("latin-1"))
@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_qwen_mask_matches_python(pattern, data):
    session(pattern, "qwen").check(data.draw(prefix_of_match(pattern)))


# -- random patterns over a small alphabet: parser + NFA + lazy DFA against Python -----------------
ATOMS = st.sampled_from([b"a", b"b", b"c", b".", b"[ab]", b"[^a]", b"[a-c]", b"\\n", b"\\w", b"\\S"])


def _patterns():
    return st.recursive(
        ATOMS,
        lambda inner: st.one_of(
            st.tuples(inner, inner).map(b"".join),
            st.tuples(inner, inner).map(lambda t: b"(" + t[0] + b"|" + t[1] + b")"),
            st.tuples(inner, st.sampled_from([b"*", b"+", b"?", b"{2}", b"{1,3}", b"{0,2}", b"{2,}"]))
              .map(lambda t: b"(?:" + t[0] + b")" + t[1]),
        ),
        max_leaves=6,
    )


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(pattern=_patterns(), text=st.binary(max_size=6).map(lambda b: bytes(b"abc\n"[x % 4] for x in b)))
def test_random_patterns_byte_vocab(pattern, text):
    s = session(pattern, "bytes")
    s.check(live_prefix(pattern, text))


@pytest.mark.parametrize("bad", [b"(ab", b"ab)", b"*a", b"a**", b"[a-", b"\\1", b"(?=a)", b"a{3,1}"])
def test_unsupported_or_bad_patterns_are_an_error(bad):
    """A bad argument traps (finish reason "error"), after logging what is wrong and where."""
    h = MiniHost(regex_wasm(), BYTE_VOCAB, 256, lambda s: [], arg=bad)
    with pytest.raises(wasmtime.Trap):
        h.step([1])
    assert any(line.startswith("regex: ") and "offset" in line and bad.decode() in line
               for line in h.logs), h.logs


@pytest.mark.parametrize("count", ["1001", "999999", "1000000", "4294967297", "9" * 30])
@pytest.mark.parametrize("form", ["a{%s}", "a{%s,}", "a{1,%s}", "a{,%s}"])
def test_repeat_counts_over_the_limit_are_the_same_error(form, count):
    """Every count over 1000 is one error, however many digits: `parse_int` once stopped reading
    at 6 digits, so `a{1000000}` fell back to literal text while `a{999999}` was an error."""
    h = MiniHost(regex_wasm(), BYTE_VOCAB, 256, lambda s: [], arg=(form % count).encode())
    with pytest.raises(wasmtime.Trap):
        h.step([1])
    assert any("repeat count over 1000" in line for line in h.logs), h.logs


@pytest.mark.parametrize("pattern", [b"a{1000}", b"a{0,1000}", b"a{01000}"])
def test_repeat_counts_up_to_the_limit_compile(pattern):
    h = MiniHost(regex_wasm(), BYTE_VOCAB, 256, lambda s: [], arg=pattern)
    (branch,) = h.step([1])
    assert branch.mask is not None and not h.logs


# -- slices: a state that keeps every string over a repeated class live takes that class's tokens
# wholesale and walks only the other tokens' trie; any other state walks the whole trie ----------
def _max_len(vocab: list[bytes], klass: bytes) -> int:
    return max(len(b) for b in vocab if b and regex.fullmatch(klass + rb"+", b))


def _slice_cases():
    gpt2, _ = gpt2_token_bytes()
    n = _max_len(gpt2, rb"[a-z ]")          # the longest [a-z ] token: where coverage ends
    return [
        # (pattern, vocab, text, slice expected)
        (rb'[^"]*"', "gpt2", b"", True),
        (rb'[^"]*"', "gpt2", b"The quick\n brown fox \\ jumps", True),
        (rb'"[^"]*"', "gpt2", b"", False),                   # needs the opening quote first
        (rb'"[^"]*"', "gpt2", b'"say', True),
        (rb"[a-zA-Z_][a-zA-Z0-9_]*", "gpt2", b"", False),      # first byte: no digits
        (rb"[a-zA-Z_][a-zA-Z0-9_]*", "gpt2", b"count_2", True),
        (rb'(?:[^"\\]|\\.)*"', "gpt2", b"a \\n b", True),
        (rb'(?:[^"\\]|\\.)*"', "gpt2", b"a \\", False),         # after a backslash, not \n: no slice
        (rb"(?:[a-z]|[0-9]|_)+!", "gpt2", b"ab_1", True),      # the alternation's union
        (rb"[a-z ]{0,40}!", "gpt2", b"a" * (40 - n), True),    # every [a-z ] token still fits
        (rb"[a-z ]{0,40}!", "gpt2", b"a" * (41 - n), False),   # the longest one no longer does
        (rb"[0-9]+", "gpt2", b"12", False),                   # too few digit tokens to be worth it
        (rb"[a-z]{0,10}x", "bytes", b"abcdefghi", True),       # byte tokens: one more letter fits
        (rb"[a-z]{0,10}x", "bytes", b"abcdefghij", False),
        (rb"\s*\w+\s*", "bytes", b"  ab", True),
    ]


@pytest.mark.parametrize("case", range(15))
def test_slice_path_matches_python(case):
    pattern, vocab, text, want_slice = _slice_cases()[case]
    s = session(pattern, vocab, b"\0nocache\0logslice\0slicesnow")
    s.check(text)
    last = s.host.logs[-1]
    assert ("slice of" in last) == want_slice, (pattern, text, last)
    if want_slice:   # the same mask from a plain whole-trie walk
        plain = session(pattern, vocab, b"\0nocache\0noslices")
        assert (plain.mask_after(text)[0].mask == s.mask_after(text)[0].mask).all()


# -- masks shared between states: under a counted repeat, states that no token (of at most the
# trie's longest token's bytes) tells apart take one mask; near the repeat's end they differ ------
SHARED = [
    (rb"(The|A)( [a-z]+){30}\.", b"The cat sat on the mat and then the dog ran off to see what the fuss was about"),
    (rb"[a-z ]{0,60}!", b"the quick brown fox jumps over the lazy dog again and again"),
    (rb"(ab|c){2,25}d", b"ababcabcccababcababcab"),
    (rb"\d{3}(-\d{3}){6}", b"123-456-789-012-345-678-901"),
]


@pytest.mark.parametrize("case", range(len(SHARED)))
def test_masks_shared_between_states_equal_each_states_own(case):
    """Every prefix of a match: the cached session's mask (shared where states agree) is the mask
    a fresh walk gives (nocache), and at the ends and the middle it is Python's."""
    pattern, text = SHARED[case]
    cached, cold = session(pattern, "gpt2"), session(pattern, "gpt2", b"\0nocache")
    toks = greedy_tokenize(cached.vocab, text)
    cuts = range(len(toks) + 1)
    for k in cuts:
        prefix = b"".join(cached.vocab[t] for t in toks[:k])
        a, b = cached.mask_after(prefix), cold.mask_after(prefix)
        assert len(a) == len(b) and all((x.mask == y.mask).all() for x, y in zip(a, b)), (pattern, prefix)
    for k in (0, len(toks) // 2, len(toks)):
        cached.check(b"".join(cached.vocab[t] for t in toks[:k]))


@pytest.mark.parametrize("case", [*range(len(SHARED)), len(SHARED)])
def test_masks_kept_from_a_states_second_visit_equal_a_fresh_walk(case):
    """The controller keeps a state's mask from its second visit on (aici_regex_mask_now): walking
    the text forward three times (first visits, then the visits that keep, then cache hits), each
    mask is the one a fresh walk gives, and the controller's first-visit set never leaks into a
    kept one."""
    pattern, text = SHARED[case] if case < len(SHARED) else (rb"[0-9]+(\.[0-9]+)?", b"31415926535.8979323846")
    kept = RegexSession(pattern, *gpt2_token_bytes(), b"\0bytes")   # its own: the walks change its cache
    cold = session(pattern, "gpt2", b"\0nocache")
    toks = greedy_tokenize(kept.vocab, text)
    want = []
    for k in range(len(toks) + 1):
        want.append(cold.mask_after(b"".join(cold.vocab[t] for t in toks[:k])))
    for walk in range(3):   # each mask_after backtracks to the prompt and feeds the prefix again
        for k in range(len(toks) + 1):
            got = kept.mask_after(b"".join(kept.vocab[t] for t in toks[:k]))
            assert len(got) == len(want[k]) and all((x.mask == y.mask).all() for x, y in zip(got, want[k])), \
                (pattern, walk, k)


# -- text mode (the controller's default): `.`, `[^...]`, \S match whole UTF-8 characters --------
# Checked against Python on the same language written out in bytes: UTF8 is one well-formed
# multi-byte character (RFC 3629), what a set holding every byte >= 0x80 matches besides its
# ASCII part. (The masks equal llguidance's on four vocabularies: tests/test_vocab_agreement.py.)
UTF8 = (rb"(?:[\xc2-\xdf][\x80-\xbf]|\xe0[\xa0-\xbf][\x80-\xbf]|[\xe1-\xec\xee\xef][\x80-\xbf]{2}"
        rb"|\xed[\x80-\x9f][\x80-\xbf]|\xf0[\x90-\xbf][\x80-\xbf]{2}|[\xf1-\xf3][\x80-\xbf]{3}"
        rb"|\xf4[\x80-\x8f][\x80-\xbf]{2})")
TEXT_PATTERNS = [   # (text mode pattern, the same language as a bytes pattern)
    (rb'[^"]*"', rb'(?:[^"\x80-\xff]|' + UTF8 + rb')*"'),
    (rb".{0,3}end", rb"(?:[^\n\x80-\xff]|" + UTF8 + rb"){0,3}end"),
    (rb"\S+x", rb"(?:[^\s\x80-\xff]|" + UTF8 + rb")+x"),
    (rb"[^\x00-\x7f]+", UTF8 + rb"+"),
    (rb"[\x80-\xbf]a", rb"[\x80-\xbf]a"),   # explicit bytes keep byte semantics
]


class TextSession(RegexSession):
    def __init__(self, pattern: bytes, reference: bytes):
        super().__init__(pattern, BYTE_VOCAB, 256)
        self.pattern = reference       # what expected() checks against


@functools.cache
def text_session(case: int) -> TextSession:
    return TextSession(*TEXT_PATTERNS[case])


@pytest.mark.parametrize("case", range(len(TEXT_PATTERNS)), ids=lambda i: TEXT_PATTERNS[i][0].decode("latin-1"))
@FAST
@given(data=st.data())
def test_text_mode_matches_utf8_language(case, data):
    s, ref = text_session(case), TEXT_PATTERNS[case][1]
    text = data.draw(st.one_of(prefix_of_match(ref), st.binary(max_size=8).map(lambda t: live_prefix(ref, t)),
                               st.text(max_size=4).map(lambda t: live_prefix(ref, t.encode()))))
    s.check(text)


def test_text_mode_refuses_bytes_that_cannot_start_a_character():
    s = text_session(0)
    br = s.mask_after(b"")
    allowed = br[0].allowed()
    assert not allowed & ({*range(0x80, 0xc2)} | {*range(0xf5, 0x100)})   # continuation, overlong, > U+10FFFF
    assert {ord("a"), 0xc3, 0xe6, 0xf0, ord('"')} <= allowed


# -- \M: one multi-byte UTF-8 character, the same language as UTF8 above, in both modes -------------
# (the json library writes "any character but ASCII" as \M: its schemas' regex texts were mostly
# that alternation written out, over and over)
M_PATTERNS = [   # (pattern with \M, the same language written out)
    (rb"(?:[a-c]|\M)*x", rb"(?:[a-c]|" + UTF8 + rb")*x"),
    (rb"\M{2}|a\M?", UTF8 + rb"{2}|a" + UTF8 + rb"?"),
    (rb'"(?:\\"|[ !#-\x7f]|\M)*"', rb'"(?:\\"|[ !#-\x7f]|' + UTF8 + rb')*"'),
]


@functools.cache
def m_session(case: int, options: bytes) -> RegexSession:
    s = RegexSession(M_PATTERNS[case][0], BYTE_VOCAB, 256, options)
    s.pattern = M_PATTERNS[case][1]   # what expected() checks against
    return s


@pytest.mark.parametrize("options", [b"", b"\0bytes"], ids=["text", "bytes"])
@pytest.mark.parametrize("case", range(len(M_PATTERNS)), ids=lambda i: M_PATTERNS[i][0].decode("latin-1"))
@FAST
@given(data=st.data())
def test_multibyte_escape_matches_utf8_language(case, options, data):
    s, ref = m_session(case, options), M_PATTERNS[case][1]
    text = data.draw(st.one_of(prefix_of_match(ref), st.binary(max_size=8).map(lambda t: live_prefix(ref, t)),
                               st.text(max_size=4).map(lambda t: live_prefix(ref, t.encode()))))
    s.check(text)


def test_multibyte_escape_is_no_class_member():
    """\\M stands for a sequence of bytes, so a class cannot hold it: the usual escape error."""
    h = MiniHost(regex_wasm(), BYTE_VOCAB, 256, lambda s: [], arg=rb"[a\M]")
    with pytest.raises(wasmtime.Trap):
        h.step([1])
    assert any("unsupported escape" in line for line in h.logs), h.logs
