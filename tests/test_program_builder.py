"""aicirt.program's builder: values render to the program JSON of docs/program.md; bad arguments raise."""
from __future__ import annotations

import pytest

from aicirt import program as P


def test_values_render_to_structural_tag_json():
    p = "Answer: " + P.select(["yes", "no"], name="a") + P.gen(stop="\n", name="why", max_tokens=20, temperature=0.5)
    assert p.to_json() == {"type": "sequence", "elements": [
        {"type": "const_string", "value": "Answer: "},
        {"type": "or", "elements": [{"type": "const_string", "value": "yes"}, {"type": "const_string", "value": "no"}],
         "name": "a"},
        {"type": "any_text", "max_tokens": 20, "name": "why", "temperature": 0.5, "stop": ["\n"]}]}
    assert P.think(max_tokens=8).to_json() == {"type": "tag", "begin": "<think>", "end": "</think>",
                                               "content": {"type": "any_text", "max_tokens": 8}}
    assert P.structural_tag(P.json({"type": "object"})) == {
        "type": "structural_tag", "format": {"type": "json_schema", "json_schema": {"type": "object"}}}
    assert P.fork(P.wait("a", "b"), P.gen(regex="[0-9]+", name="a", capture="append")).to_json() == {
        "type": "fork", "branches": [{"type": "wait", "vars": ["a", "b"]},
                                     {"type": "regex", "pattern": "[0-9]+", "name": "a", "capture": "append"}]}
    assert P.repeat("x", 1, None).to_json()["max"] == -1
    assert P.as_format({"type": "const_string", "value": "v"}) == P.const("v")


def test_every_builder_value_validates():
    t = P.tag("<a>", P.text(), "</a>")
    for f in [P.const("x"), P.regex("[a-z]"), P.json(True), P.text(excludes=["!"]), P.optional("x"), P.star("x"),
              P.plus("x"), P.repeat("x", 0, 3), t, P.triggered_tags(["<a"], [t]), P.tags_with_separator([t], ","),
              P.token(3), P.exclude_token([1, "x"]), P.any_tokens([0], max_tokens=4), P.fork("a", "b"), P.wait("v")]:
        P.validate(f.to_json())


@pytest.mark.parametrize("make", [
    lambda: P.gen(regex="a", max_tokens=3), lambda: P.gen(name=""), lambda: P.gen(stop=""),
    lambda: P.select([]), lambda: P.fork(), lambda: P.wait(), lambda: P.repeat("x", 3, 2),
    lambda: P.text(max_tokens=-1), lambda: P.const("x", capture="set"), lambda: P.gen(temperature=101)])
def test_bad_arguments_raise(make):
    with pytest.raises(ValueError):
        make()


def test_non_formats_raise_type_error():
    with pytest.raises(TypeError):
        P.seq(3)


def test_label_backtrack_and_var_render_the_controller_s_json():
    p = P.seq(P.label("T", P.gen(name="t", stop="\n")), P.backtrack("T", "Answer: ", P.var("t")), "!")
    assert p.to_json()["elements"][:2] == [
        {"type": "any_text", "name": "t", "stop": ["\n"], "label": "T"},
        {"type": "backtrack", "to": "T", "text": ["Answer: ", {"var": "t"}]}]
    P.validate(p.to_json())
    with pytest.raises(ValueError):
        P.backtrack("")
    with pytest.raises(TypeError):
        P.backtrack("T", 3)          # type: ignore[arg-type]
    with pytest.raises(ValueError):
        P.var("")
    with pytest.raises(P.ProgramError, match="no label before this step is called T"):
        P.validate(P.seq(P.backtrack("T"), P.label("T", "x")).to_json())
