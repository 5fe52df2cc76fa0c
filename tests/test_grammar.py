"""The `grammar` controller (controllers/grammar): Lark grammars as llguidance reads them.

Conformance: the grammars in tests/grammars/ (each NAME.lark with NAME.json: valid and near-miss
invalid strings); for every prefix of every string the controller's mask equals llguidance's
(forcing off, see harness.LLG_PREAMBLE), bit for bit; valid strings are accepted, invalid ones
rejected, by both. The default run uses a byte vocabulary (every grammar) and Qwen2's on two
grammars; `-m slow` runs every grammar on Qwen2. Plus: errors name the construct and its line,
backtracking, and Hypothesis over random small grammars and random strings.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import llguidance  # noqa: E402,F401  (the dev extra: a missing one fails, never skips)
sys.path.insert(0, str(Path(__file__).resolve().parent / "grammars"))

from harness import Llg, Ours, allowed, as_mask, byte_vocab, compare, dup_vocab, llama2_vocab, qwen_vocab  # noqa: E402

GRAMMARS = Path(__file__).resolve().parent / "grammars"
NAMES = sorted(p.stem for p in GRAMMARS.glob("*.lark"))


def load(name: str) -> tuple[str, list[str], list[str]]:
    cases = json.loads((GRAMMARS / f"{name}.json").read_text(encoding="utf-8"))
    return (GRAMMARS / f"{name}.lark").read_text(encoding="utf-8"), cases["valid"], cases["invalid"]


def _pair(v):
    ours = Ours(v)
    yield ours, Llg(v), v
    ours.close()


@pytest.fixture(scope="module")
def bytes_pair():
    yield from _pair(byte_vocab())


@pytest.fixture(scope="module")
def qwen_pair():
    yield from _pair(qwen_vocab())


@pytest.fixture(scope="module")
def llama2_pair():
    yield from _pair(llama2_vocab())


@pytest.fixture(scope="module")
def dup_pair():
    yield from _pair(dup_vocab())


def check_conformance(pair, name: str):
    ours, llg, v = pair
    grammar, valid, invalid = load(name)
    r = compare(ours, llg, grammar, [s.encode("utf-8") for s in valid + invalid], v)
    assert r["ours_error"] is None and r["llg_error"] is None, r
    problems = []
    for i, (text, ours_ok, llg_ok, diff, _) in enumerate(r["results"]):
        want = i < len(valid)
        if diff is not None:
            problems.append(f"{text!r}: masks differ after {diff[1]!r}: {diff[2]}")
        if ours_ok != want or llg_ok != want:
            problems.append(f"{text!r}: expected {'accepted' if want else 'rejected'}, ours {ours_ok}, llguidance {llg_ok}")
    assert not problems, "\n".join(problems)


def test_suite_size():
    n_valid = sum(len(load(n)[1]) for n in NAMES)
    n_invalid = sum(len(load(n)[2]) for n in NAMES)
    assert len(NAMES) >= 20 and n_valid >= 250 and n_invalid >= 100, (len(NAMES), n_valid, n_invalid)


@pytest.mark.parametrize("name", NAMES)
def test_conformance_bytes(bytes_pair, name):
    check_conformance(bytes_pair, name)


@pytest.mark.parametrize("name", ["arith", "dyck"])
def test_conformance_qwen_slice(qwen_pair, name):
    check_conformance(qwen_pair, name)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_conformance_qwen(qwen_pair, name):
    check_conformance(qwen_pair, name)


@pytest.mark.parametrize("name", NAMES)
def test_conformance_llama2(llama2_pair, name):
    """Llama 2's SentencePiece vocabulary with byte fallback: 125 byte strings have two ids
    (`<0x41>` and `A`), so the trie's root has more than 256 children (the extra ids are leaf
    siblings with the same byte). Every grammar, every prefix, masks equal to llguidance's."""
    check_conformance(llama2_pair, name)


@pytest.mark.parametrize("name", NAMES)
def test_conformance_duplicate_ids(dup_pair, name):
    """A vocabulary where every byte has two ids and some strings three (tests/_vocabs.py)."""
    check_conformance(dup_pair, name)


def test_llama2_vocabulary_has_duplicate_byte_strings():
    """The premise of the two tests above: the committed tokenizer is Llama 2's, byte fallback."""
    from collections import Counter
    v = llama2_vocab()
    dups = [b for b, n in Counter(b for b in v.token_bytes if b).items() if n > 1]
    assert v.n == 32000 and v.eos == 2 and len(dups) == 125, (v.n, v.eos, len(dups))


#: After whitespace the next lexeme starts at the letter of every " word" token; a run of edges at
#: every word child of the trie's space node is applied as the next lexeme's root part over the
#: space trie (docs/grammar.md). Around its conditions: a whitespace lexeme that takes letters
#: (no such run), a next lexeme that may be empty (its edges at the space trie's root), a terminal
#: (not %ignore) whitespace that may go on, lexemes after the space that are lazy, stop or
#: max_tokens ones, and "\n x" / "  x" beside " x" in one run.
SPACE_RUN = [
    ('start: NAME+\nNAME: /[a-z]+/\n%ignore /[ abc]+/\n', ["xy  dz", "x def"], ["x A"]),
    ('start: "q" NAME+\nNAME: /x[0-9]+/\n%ignore /[ x]+/\n', ["qx1x2", "qx12"], ["q x1"]),
    ('start: "x" B ";"\nB: /[a-z]*/\n%ignore " "\n', ["x ;", "x abc;", "x  abc ;"], ["x 1;"]),
    ('start: NAME (SP NAME)*\nSP: / +/\nNAME: /[A-Za-z_][A-Za-z0-9_]*/\n', ["foo bar  Baz_1"], ["foo 1x", "foo\nbar"]),
    ('start: "say" text "!"\ntext[stop="."]: /[a-z ]+/\n%ignore " "\n', ["say hello there.!"], ["say hi!"]),
    ('start: "a" w+\nw[max_tokens=2]: /[a-z]+/\n%ignore /[ \\n]+/\n', ["a bc\n de", "a the quick brown"], ["a B"]),
    ('start: "f" w\nw[lazy]: /[a-z]+[0-9]/\n%ignore /[ \\t\\n]+/\n', ["f abc1", "f\n\tx9"], ["f 1"]),
]


@pytest.mark.parametrize("case", range(len(SPACE_RUN)))
def test_space_run_agrees_with_llguidance(llama2_pair, qwen_pair, case):
    grammar, valid, invalid = SPACE_RUN[case]
    for pair in (llama2_pair, qwen_pair):
        ours, llg, v = pair
        r = compare(ours, llg, grammar, [t.encode() for t in valid + invalid], v)
        assert r["ours_error"] is None and r["llg_error"] is None, r
        for i, (text, ours_ok, llg_ok, diff, _) in enumerate(r["results"]):
            assert diff is None, (v.name, text, diff)
            assert ours_ok == llg_ok == (i < len(valid)), (v.name, text, ours_ok, llg_ok)


ERRORS = [
    ('start: a\n', "undefined rule a"),
    ('start: "a"\nb: c\n', "undefined rule c"),
    ('x: "a"\n', "no 'start' rule"),
    ('start: "a"\n%declare FOO\n', "line 2: unsupported: %declare"),
    ('start: "a"\n\n%import foo.BAR\n', "line 3: unsupported: %import of foo"),
    ('start: A\nA.2: "a"\n', "line 2: priority not supported"),
    ('start: /(?=a)b/\n', "lookaround is not supported"),
    ('start: /a+?/\n', "lazy repeats"),
    ('start: /\\bword/\n', "word boundaries"),
    ('start: x\nx{t}: t\n', "line 2: unsupported: templates"),
    ('start: "a" <|not_a_token|>\n', "special token <|not_a_token|>: not a special token of this tokenizer"),
    ('start: A\nA: "a" <[5]>\n', "special tokens cannot be used inside terminals"),
    ('start: <[5-x]>\n', "line 1: bad token range in <[5-x]>"),
    ('start: "a"\n  | %json {"type": }\n', "line 2: %json: not JSON"),
    ('start: %json {"type": "object"\n', "line 1: unterminated %json"),
    ('start: A\nA: "x" %json {"type": "integer"}\n', "line 2: %json cannot be used inside terminals"),
    ('start: %json {"type": "string", "format": "no-such-format"}\n', "line 1: %json: unsupported"),
    ('start: x\nx[temperature=0.5]: /a+/\n', "line 2: unsupported: rule option temperature"),
    ('start: x\nx[max_tokens=3]: "a" y\ny: "b"\n', "line 2: lexeme options need a terminal body in rule x"),
    ('start: x\nx[max_tokens]: /a+/\n', "line 2: max_tokens needs a number"),
    ('start: x\nx[stop=""]: /a+/\n', "line 2: unsupported: stop=\"\""),
    ('start: A\nA: A "a"\n', "terminal A is recursive"),
    ('start: A\nA: b\nb: "x"\n', "a terminal cannot use rule b"),
    ('start: "unterminated\n', "line 1: newline in a string literal"),
    ('start: "a"\n%llguidance {"x": 1}\n', "line 2: unsupported: %llguidance option x"),
    ('start: "\\ud800"\n', "line 1: surrogate escape in a string literal"),
    ('start: "a\\uDFFFb"\n', "line 1: surrogate escape in a string literal"),
    ('start: /\\ud800/\n', "surrogate escape"),
    ('start: /[\\ud800-\\udfff]/\n', "surrogate escape"),
    ('start: /\\x{110000}/\n', "escape out of range"),
    # GBNF, the same core behind its own front-end
    ('root ::= "a\n', "line 1: gbnf: newline in a literal"),
    ('x ::= "a"\n', "no 'root' rule"),
    ('root ::= "a"\nroot "b"\n', "line 2: gbnf: expected ::="),
    ('root ::= [ab\n"x"]\n', "gbnf: newline in a character class"),
    ('start: a\na: "x" a\n', "the grammar has no finite sentence: rules 'start', 'a' never end"),
    ('start: start\n', "the grammar has no finite sentence: rule 'start' never ends"),
    ('start: b c\nb: "x" b | "y"\nc: c "z"\n', "no finite sentence: rules 'start', 'c' never end"),
    ('root ::= "x" root\n', "no finite sentence: rules 'start', 'root' never end"),
    ('root ::= "\\ud800"\n', "surrogate escape"),
    ('root ::= [\\uD800-\\uDBFF]\n', "surrogate escape"),
]


@pytest.mark.parametrize("grammar,message", ERRORS, ids=[e[1][:30] for e in ERRORS])
def test_errors_name_the_construct(bytes_pair, grammar, message):
    ours = bytes_pair[0]
    h, err, _ = ours.open(grammar)
    ours.close_handle(h)
    assert err is not None and message in err, err


def test_stops_when_complete_and_allows_eos_when_accepting(bytes_pair):
    ours, _, v = bytes_pair
    h, err, _ = ours.open('start: "ab" "c"?\n')
    try:
        masks = ours.masks(h, list(b"abc"))
        assert [allowed(m, v.eos) for m in masks[:3]] == [False, False, True]   # after "ab": EOS or "c"
        assert masks[3] is None                                                  # after "abc": stop
    finally:
        ours.close_handle(h)


def test_backtrack_restores_the_masks(bytes_pair):
    """The engine backtracks (the next call sees fewer tokens): the masks are those of the shorter
    text, here with an Earley set popped and a lexeme reopened."""
    ours, _, _ = bytes_pair
    h, err, _ = ours.open('start: NAME ("," NAME)*\nNAME: /[a-z]+/\n')
    req, seq, _ = h
    child = seq.fork()
    try:
        _, m_ab = ours._submit(child, list(b"ab"), ord("b"), record=False)
        _, m_comma = ours._submit(child, list(b"ab,"), ord(","), record=False)
        _, back = ours._submit(child, list(b"ab"), None, record=False)
        assert allowed(m_ab, ord(",")) and not allowed(m_comma, ord(","))
        assert np.array_equal(back, m_ab)
    finally:
        child.close()
        ours.close_handle(h)


# ---- Hypothesis: random small grammars, random strings ----------------------------------------
import hypothesis as hyp  # noqa: E402  (the dev extra)
st = hyp.strategies

TERMS = ['"a"', '"b"', '"ab"', '"ba"', '/a+/', '/[ab]/', '/b*a/', '" "', 'A', 'B']
TERM_DEFS = 'A: "a" "b"?\nB: /b+/ | "ab"\n'


@st.composite
def grammars(draw):
    n_rules = draw(st.integers(1, 3))
    names = ["start"] + [f"r{k}" for k in range(1, n_rules)]

    def item():
        atom = draw(st.sampled_from(TERMS + names))
        return atom + draw(st.sampled_from(["", "", "", "?", "*", "+", "{1,2}"]))

    lines = []
    for name in names:
        alts = [" ".join(item() for _ in range(draw(st.integers(1, 3)))) for _ in range(draw(st.integers(1, 3)))]
        lines.append(f"{name}: " + " | ".join(alts))
    ignore = draw(st.sampled_from(["", '%ignore " "\n']))
    return "\n".join(lines) + "\n" + TERM_DEFS + ignore


def random_grammars_agree(bytes_pair, grammar, texts):
    ours, llg, v = bytes_pair
    r = compare(ours, llg, grammar, [t.encode() for t in texts], v)
    if r["ours_error"] is not None and "no finite sentence" in r["ours_error"] and r["llg_error"] is None:
        # a grammar with no finite sentence (start: start, a: "x" a): we refuse it, naming the rules
        # that never end; llguidance compiles it, and nothing it allows can ever end
        lm, _, _ = llg.compile(grammar)
        first = llg.masks(lm, [])[0]     # None: llguidance stopped at once (start: start)
        assert first is None or not allowed(first, v.eos), grammar
        return
    if r["ours_error"] is not None and "no token can continue" in r["ours_error"] and r["llg_error"] is None:
        # a grammar with no sentence (start: start): we stop at once; llguidance allows nothing either
        lm, _, _ = llg.compile(grammar)
        first = as_mask(llg.masks(lm, [])[0], v)
        assert not any(allowed(first, t) for t in range(v.n) if t != v.eos), grammar
        return
    if r["llg_error"] is not None or r["ours_error"] is not None:
        # both refuse, or llguidance refuses what we accept (e.g. its limits on ambiguous grammars)
        assert r["ours_error"] is None or r["llg_error"] is not None, (grammar, r)
        return
    for text, a, b, diff, _ in r["results"]:
        assert diff is None and a == b, (grammar, text, diff, a, b)


SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=list(hyp.HealthCheck))
STRINGS = st.lists(st.text(alphabet="ab ", max_size=8), min_size=1, max_size=4)


@hyp.settings(max_examples=12, **SETTINGS)
@hyp.given(grammar=grammars(), texts=STRINGS)
def test_random_grammars_agree_with_llguidance(bytes_pair, grammar, texts):
    random_grammars_agree(bytes_pair, grammar, texts)


@pytest.mark.slow
@hyp.settings(max_examples=300, **SETTINGS)
@hyp.given(grammar=grammars(), texts=STRINGS)
def test_random_grammars_agree_with_llguidance_many(bytes_pair, grammar, texts):
    random_grammars_agree(bytes_pair, grammar, texts)


# ---- GBNF ------------------------------------------------------------------------------------
GBNF = json.loads((GRAMMARS / "gbnf_cases.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", sorted(GBNF))
def test_gbnf_agrees_with_llguidance_on_its_lark_translation(bytes_pair, name):
    """Our GBNF front-end (one-character lexemes: the character-level language) against
    llguidance on llguidance.gbnf_to_lark's translation of the same text: same masks on these
    grammars, where no two lexemes of the translation compete for the same text."""
    from llguidance.gbnf_to_lark import gbnf_to_lark
    ours, llg, v = bytes_pair
    text = (GRAMMARS / f"{name}.gbnf").read_text(encoding="utf-8")
    cases = GBNF[name]
    strings = [s.encode("utf-8") for s in cases["valid"] + cases["invalid"]]
    h, err, _ = ours.open(text)
    lm, lerr, _ = llg.compile(gbnf_to_lark(text))
    assert err is None and lerr is None, (err, lerr)
    try:
        for i, s in enumerate(strings):
            toks = v.tokenize(s)
            a, b = ours.masks(h, toks), llg.masks(lm, toks)
            assert len(a) == len(b), s
            for k, (x, y) in enumerate(zip(a, b)):
                assert np.array_equal(as_mask(x, v), as_mask(y, v)), (s, k)
            accepted = len(a) == len(toks) + 1 and allowed(as_mask(a[-1], v), v.eos)
            assert accepted == (i < len(cases["valid"])), s
    finally:
        ours.close_handle(h)


def test_gbnf_is_character_level(bytes_pair):
    """Where a longest-match lexer would pick one split, the GBNF language is kept whole:
    "abc" is [a-z] then "bc", though "ab" "x" also starts with "ab"."""
    ours = bytes_pair[0]
    h, err, _ = ours.open('root ::= "ab" "x" | [a-z] "bc"\n')
    assert err is None, err
    try:
        masks = ours.masks(h, list(b"abc"))
        assert len(masks) == 4 and allowed(as_mask(masks[3], bytes_pair[2]), bytes_pair[2].eos)
    finally:
        ours.close_handle(h)


# ---- under vLLM's host semantics (the steering core, no vLLM needed) -------------------------
def test_grammar_under_the_vllm_steering_core():
    """The vLLM plugin's engine-independent core (one token a step, masks only): the grammar
    controller, by its shipped name's build, writes a sentence of the grammar and ends with EOS."""
    import re

    import aicirt
    from aicirt.engine.backends.scripted import ScriptedBackend
    from aicirt.integrations import steering
    from test_vllm_steering import MaskOnlyHost
    from harness import grammar_wasm

    tok = aicirt.ByteTokenizer()
    rt = aicirt.Runtime(tok, cache_dir=False)
    try:
        ctrl = rt.load(grammar_wasm())
        host = MaskOnlyHost(steering.Steering(rt, tok.eos_token_id),
                            ScriptedBackend(tok, script="the quick brown fox jumps over the lazy dog "), max_tokens=40)
        out = host.add(ctrl, b'start: WORD ("," WORD){2}\nWORD: /[a-z]{1,4}/\n')
        host.run()
        (s, _), = host.done
        s.close()
    finally:
        rt.close()
    assert out[-1] == tok.eos_token_id, bytes(out)
    assert re.fullmatch(rb"[a-z]{1,4}(,[a-z]{1,4}){2}", bytes(out[:-1])), bytes(out)


def test_special_tokens_by_id_agree_with_llguidance(qwen_pair):
    """<[id]> and <[lo-hi]>: special tokens (no bytes) matched by id, after a lexeme ends or at a
    lexeme boundary; masks equal to llguidance's along text, special token, text. (The ranges
    hold special tokens only: llguidance would also match byte tokens and EOS by id.)"""
    ours, llg, v = qwen_pair
    grammar = 'start: TEXT <[151644]> "x" | "a" <[151645-151646]> | <[151700-151710]> "y"\nTEXT: /[a-z ]+/\n'
    h, err, _ = ours.open(grammar)
    lm, lerr, _ = llg.compile(grammar)
    assert err is None and lerr is None, (err, lerr)
    try:
        for toks in (v.tokenize(b"hello") + [151644] + v.tokenize(b"x"), v.tokenize(b"a") + [151646],
                     [151700] + v.tokenize(b"y"), v.tokenize(b"a") + [151644]):
            a, b = ours.masks(h, toks), llg.masks(lm, toks)
            assert len(a) == len(b), toks
            for k, (x, y) in enumerate(zip(a, b)):
                assert np.array_equal(as_mask(x, v), as_mask(y, v)), (toks, k)
    finally:
        ours.close_handle(h)


#: max_tokens lexemes and the token sequences fed (pieces tokenized one by one, so that lexemes
#: start and end inside tokens, at their edges, and span several).
MAX_TOKENS_CASES = [
    ('start: "<" word ">"\nword[max_tokens=2]: /[a-z]+/\n',
     [["<hello>"], ["<", "h", "e", ">"], ["<internationalization>"], ["<a", "b", "c>"], ["<", "ab", "cd", "ef>"]]),
    ('start: item ("," item)*\nitem[max_tokens=3]: /[a-z]+/\n%ignore " "\n',
     [["abc,def"], ["a", "b", "c", "d"], ["ab", ",", "cd", "ef", "gh", "ij"], ["abcdefghijklmnop,qrstuvwxyz"],
      [" ", "a", "b", " ,c"]]),
    ('start: "<" w ">"\nw[max_tokens=3, lazy]: /[a-z]+x/\n', [["<abcdefx>"], ["<", "a", "x>"], ["<ab", "cx", ">"]]),
    ('start: a | b\na[max_tokens=2]: /[a-z]+1/\nb: /[a-z]+2/\n', [["abcdef2"], ["a", "b", "c", "2"], ["a", "b", "1"], ["ab1"]]),
    ('start: "<" word ">"\nword[max_tokens=0]: /[a-z]+/\n', [["<>"], ["<a>"]]),
    ('start: "x=" v ";"\nv[max_tokens=2]: /[0-9a-z]+/\n', [["x=ab;"], ["x=a", "b", "c;"], ["x", "=", "1", "2", "3", ";"], ["x=", "123", "45;"]]),
    ('start: word+\nword[max_tokens=1]: /[a-z]+/ " "?\n', [["hello world "], ["h", "e", "l"], ["ab", "cd"]]),
    ('start: (NUM | name)+\nname[max_tokens=2]: /[a-z]+/\nNUM: /[0-9]+/\n%ignore /[ \\n]+/\n',
     [["hello 42 world"], ["abc", "def", " 1", "2 x"], ["\n", "a", "b", "c", "d"]]),
]


def test_max_tokens_agrees_with_llguidance(qwen_pair):
    """[max_tokens=N]: a lexeme spans at most N tokens, counted as llguidance counts them (from
    the token holding its row's start byte), cut short as llguidance does (the lexeme ends where
    the budget is spent, matched or not); masks equal to llguidance's at every prefix."""
    ours, llg, v = qwen_pair
    for grammar, strings in MAX_TOKENS_CASES:
        h, err, _ = ours.open(grammar)
        lm, lerr, _ = llg.compile(grammar)
        assert err is None and lerr is None, (grammar, err, lerr)
        try:
            for pieces in strings:
                toks = [t for p in pieces for t in v.tokenize(p.encode())]
                a, b = ours.masks(h, toks), llg.masks(lm, toks)
                assert len(a) == len(b), (grammar, pieces, len(a), len(b))
                for k, (x, y) in enumerate(zip(a, b)):
                    assert np.array_equal(as_mask(x, v), as_mask(y, v)), (grammar, pieces, k)
        finally:
            ours.close_handle(h)


def test_max_tokens_cuts_the_lexeme(qwen_pair):
    """After two tokens inside `word`, only its end can follow: the limit is enforced, not only
    agreed on."""
    ours, _, v = qwen_pair
    h, err, _ = ours.open('start: "say " word "."\nword[max_tokens=2]: /[a-z]+/\n')
    assert err is None, err
    try:
        head = v.tokenize(b"say ")
        masks = ours.masks(h, head + v.tokenize(b"ab") + v.tokenize(b"cd"))
        assert allowed(masks[len(head) + 1], v.tokenize(b"cd")[0])   # the lexeme's second token
        last = masks[len(head) + 2]                                   # after it: "." only
        assert allowed(last, v.tokenize(b".")[0]) and not allowed(last, v.tokenize(b"e")[0])
    finally:
        ours.close_handle(h)
