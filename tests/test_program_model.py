"""The `program` controller on the default model (SmolLM2, CPU): every output valid or parsed. Slow."""
from __future__ import annotations

import json
import re

import pytest

from aicirt import program as P

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def model_available():
    pytest.importorskip("transformers")
    try:
        from aicirt.engine.backends import model_files
        model_files.resolve(None)
    except FileNotFoundError as e:
        pytest.skip(str(e))


def test_json_mode_and_a_schema():
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                               "population": {"type": "integer", "minimum": 0},
                                               "country": {"type": "string", "enum": ["France", "Spain", "Italy"]}},
              "required": ["city", "population", "country"], "additionalProperties": False}
    res = P.run(P.structural_tag(P.json(schema)), prompt="Describe Paris as JSON.", max_tokens=80)
    jsonschema.validate(json.loads(res.text), schema)
    res = P.run(P.json({"type": "object"}), prompt="Give me a JSON object about cats.", max_tokens=60)
    assert res.finish_reasons[0] in ("stop", "length")
    if res.finish_reasons[0] == "stop":
        assert isinstance(json.loads(res.text), dict)


def test_think_then_answer_and_a_choice_then_an_explanation():
    res = P.run(P.seq(P.think(max_tokens=24), "\nAnswer: ", P.gen(regex="[0-9]{1,3}", name="answer")),
                prompt="What is 12 + 30?", max_tokens=64)
    assert re.fullmatch(r"<think>.*</think>\nAnswer: [0-9]{1,3}", res.text, re.S), res.text
    assert res.variables["answer"] == res.text.rsplit(" ", 1)[1]
    res = P.run(P.seq(P.select(["positive", "negative"], name="label"), ": ",
                      P.gen(stop="\n", name="why", max_tokens=20, temperature=0.7)),
                prompt="Classify: 'I loved this film.'", max_tokens=40, seed=1)
    assert res.variables["label"] in ("positive", "negative")
    assert res.text.startswith(res.variables["label"] + ": ")


def test_two_forks_and_a_parent_that_waits():
    p = P.seq("Facts:\n", P.fork(
        P.seq(P.wait("a", "b"), "Done."),
        P.seq("A: ", P.gen(regex="[A-Z][a-z]{2,12}", name="a")),
        P.seq("B: ", P.gen(regex="[0-9]{1,4}", name="b"))))
    res = P.run(p, prompt="Name a city and a year.", max_tokens=40)
    assert res.texts[0] == "Facts:\nDone." and len(res.texts) == 3
    assert res.texts[1] == "Facts:\nA: " + res.variables["a"] and res.texts[2] == "Facts:\nB: " + res.variables["b"]


def test_think_capture_backtrack_then_answer():
    draft = P.seq(P.think(max_tokens=24), "\nConclusion: ", P.gen(regex="[0-9]{1,3}", name="conclusion"))
    prog = P.seq(P.label("draft", draft), P.backtrack("draft", "Known: ", P.var("conclusion"), "\nAnswer: "),
                 P.gen(regex="[0-9]{1,3}", name="answer"))
    res = P.run(prog, prompt="What is 12 + 30?", max_tokens=80)
    c = res.variables["conclusion"]
    # the thought is gone from the text: only the captured conclusion was forced back in
    assert "<think>" not in res.text and res.text.startswith(f"Known: {c}\nAnswer: ")
    assert re.fullmatch(r"[0-9]{1,3}", res.variables["answer"])


def test_a_grammar_inside_a_tag():
    expr = 'start: expr\nexpr: term (("+" | "*") term)*\nterm: NUM | "(" expr ")"\nNUM: /[0-9]{1,3}/\n'
    res = P.run(P.seq("<calc>", P.grammar(expr, name="e"), "</calc>"), prompt="Write an arithmetic expression.",
                max_tokens=40)
    e = res.variables.get("e", "")
    assert res.text == f"<calc>{e}</calc>" or res.finish_reasons[0] == "length"
    assert re.fullmatch(r"[0-9()+*]*", e)
