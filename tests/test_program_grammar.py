"""The `grammar` format inside a program: the grammar controller's core compiled into the program
controller. Masks must equal the standalone `grammar` controller's, token for token, alone and
composed with literals (tokens that cross the grammar's boundary included); errors name the
grammar's line."""
from __future__ import annotations

import json

import pytest
from test_program import EOS, MergeTokenizer, run, texts

import aicirt
from aicirt import Capabilities, StepInput
from aicirt import program as P
from aicirt.build.toolchain import build_cached

EXPR = 'start: expr\nexpr: term ("+" term)*\nterm: NUM | "(" expr ")" | "a" | "b"\nNUM: /[0-9]+/\n'
KV = 'root ::= pair ("," pair)*\npair ::= [a-z]+ "=" ([0-9]+ | "\\"" [a-z ]* "\\"")\n'           # GBNF
WS = 'start: item+\nitem: WORD | NUM\nWORD: /[a-z]+/\nNUM: /[0-9]+/\n%ignore /[ ]+/\n'
TOK = MergeTokenizer(["ab", "a+", "+b", "(a", "b)", "))", "1+", "+2", "12", "2<", ")<", "</", "a>", "<a>(", "</a>",
                      "b</", "x=", "=1", ",y", "\"h", "i\"", "ab ", " 1", "2 c"])


@pytest.fixture(scope="module")
def rt():
    r = aicirt.Runtime(TOK, limits=aicirt.Limits(soft_deadline_s=5.0), cache_dir=False)
    yield r
    r.close()


@pytest.fixture(scope="module")
def wasms():
    return build_cached("program"), build_cached("grammar")


def masks(rt, wasm, arg: bytes, toks: list[int]) -> list[frozenset[int] | None]:
    """The mask at every step of `toks` (no fast-forward granted: every step is a mask)."""
    req = rt.new_request(rt.load(wasm), arg=arg, capabilities=Capabilities.NONE)
    seq = req.spawn()
    out: list[frozenset[int] | None] = []
    full = [1]
    from conftest import mask_tokens
    for i in range(len(toks) + 1):
        o = rt.submit([StepInput(seq, list(full), full[-1] if i else None)]).wait()
        r = o.results[0]
        if not r.branches or r.branches[0].mask_row is None:
            out.append(None)
            break
        out.append(frozenset(mask_tokens(o, r.branches[0].mask_row)))
        if i < len(toks):
            full.append(toks[i])
    return out


@pytest.mark.parametrize("grammar,text", [(EXPR, "(a+b)+12"), (EXPR, "a+(b+(1+2))"), (KV, 'x=12,y="hi"'),
                                          (WS, "ab 12 c")])
def test_masks_equal_the_grammar_controller_s(rt, wasms, grammar, text):
    prog, gram = wasms
    toks = TOK.encode(text)
    ours = masks(rt, prog, P.grammar(grammar).dumps().encode(), toks)
    assert ours == masks(rt, gram, grammar.encode(), toks)
    assert len(ours) == len(toks) + 1 and EOS in (ours[-1] or ())


@pytest.mark.parametrize("text", ["<a>(a+b)+12</a>", "<a>a+(b+(1+2))</a>", "<a>b</a>"])
def test_in_a_sequence_the_masks_cross_the_boundary_exactly(rt, wasms, text):
    # "b</" and "2<" end the grammar's text and start the literal after it: allowed iff they fit,
    # as in the standalone controller given the whole language as one grammar
    prog, gram = wasms
    toks = TOK.encode(text)
    whole = 'start: "<a>" expr "</a>"\n' + EXPR.split("\n", 1)[1]
    ours = masks(rt, prog, P.seq("<a>", P.grammar(EXPR), "</a>").dumps().encode(), toks)
    assert ours == masks(rt, gram, whole.encode(), toks)


def test_inside_triggered_tags_inside_a_sequence(wasms):
    prog = P.seq("Calc: ", P.triggered_tags(["<a>"], [P.tag("<a>", P.grammar(EXPR, name="e"), "</a>")],
                                            stop_after_first=True), "!")
    trace, req = run(wasms[0], prog, "Calc: hm <a>(a+zz)</a>", tokenizer=TOK)
    # free text until the trigger ("<a>(" crosses from it into the grammar), then the grammar:
    # "z" is refused (the scripted model takes its next choice under the mask), then the end tag
    # (healed: "</" is replaced by "</a>" with the "!" after it in one splice)
    assert trace == [(0, 0, "Calc:"), (0, 0, " "), (0, 0, "h"), (0, 0, "m"), (0, 0, " "), (0, 0, "<a>("),
                     (0, 0, "a+"), (0, 0, "a"), (0, 0, ")"), (0, 0, "+2"), (0, 0, "</"), (0, 1, "</a>!")]
    assert texts(req) == ["Calc: hm <a>(a+a)+2</a>!"] and req.variables == {"e": b"(a+a)+2"}


def test_a_grammar_that_does_not_compile_names_its_line(rt, wasms):
    bad = P.seq("x", P.grammar('start: a\na: "x" |\nb: /(/\n'))
    req = rt.new_request(rt.load(wasms[0]), arg=bad.dumps().encode(), capabilities=Capabilities.ALL)
    seq = req.spawn()
    log = rt.submit([StepInput(seq, [1], None)]).wait().results[0].logs
    assert log.startswith("program: at /elements/1/grammar: grammar: line 3: "), log
