"""A small builder whose values render to the `program` controller's JSON (docs/program.md).

    from aicirt import program as P
    p = P.seq("Answer: ", P.select(["yes", "no"], name="answer"), "\\nBecause ",
              P.gen(stop="\\n", name="why", max_tokens=40))
    p.to_json()          # {"type": "sequence", "elements": [...]}: XGrammar's structural-tag formats

Every function returns a `Format`; `a + b` is a sequence and a plain `str` is a literal
(`const_string`) wherever a format is expected. `structural_tag(p)` wraps a format in XGrammar's
request shape. Arguments are checked when a value is built (ValueError / TypeError: misuse of a
builder function); the whole program by the controller's first call (`aicirt.program.validate`,
`ProgramError`) when it is run.
"""
from __future__ import annotations

import json as _json
from collections.abc import Iterable, Mapping
from typing import Any, Union

FormatLike = Union["Format", str]


class Format:
    """One format: `spec` is its JSON object (a fresh dict; nothing shares it)."""

    __slots__ = ("spec",)

    def __init__(self, spec: dict[str, Any]):
        if not isinstance(spec, dict) or not isinstance(spec.get("type"), str):
            raise TypeError(f'a format is a dict with a "type", got {spec!r}')
        self.spec = spec

    def to_json(self) -> dict[str, Any]:
        """The format as a JSON-ready dict (a deep copy)."""
        return _json.loads(_json.dumps(self.spec))

    def dumps(self) -> str:
        """The format's JSON text: the controller's argument."""
        return _json.dumps(self.spec, ensure_ascii=False)

    def __add__(self, other: FormatLike) -> Format:
        return seq(self, other)

    def __radd__(self, other: FormatLike) -> Format:
        return seq(other, self)

    def __repr__(self) -> str:
        return f"Format({self.dumps()})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Format) and self.spec == other.spec

    def __hash__(self) -> int:
        return hash(self.dumps())


def as_format(x: FormatLike | Mapping[str, Any]) -> Format:
    """A `Format` as is, a `str` as its literal, a dict (a format's JSON) wrapped. Raises TypeError."""
    if isinstance(x, Format):
        return x
    if isinstance(x, str):
        return Format({"type": "const_string", "value": x})
    if isinstance(x, Mapping):
        return Format(_json.loads(_json.dumps(dict(x))))
    raise TypeError(f"expected a Format, a str or a format dict, got {type(x).__name__}")


def _with(spec: dict[str, Any], *, name: str | None = None, capture: str | None = None,
          temperature: float | None = None, stop: Iterable[str] | str | None = None,
          label: str | None = None) -> Format:
    """The keys any format may carry: a variable it is captured into, a temperature, stop strings,
    a label (where a later `backtrack` cuts the text back to)."""
    if label is not None:
        if not isinstance(label, str) or not label:
            raise ValueError("label must be a non-empty string")
        spec["label"] = label
    if name is not None:
        if not isinstance(name, str) or not name:
            raise ValueError("name must be a non-empty string")
        spec["name"] = name
        if capture is not None:
            if capture not in ("set", "append"):
                raise ValueError('capture must be "set" or "append"')
            spec["capture"] = capture
    elif capture is not None:
        raise ValueError("capture needs a name")
    if temperature is not None:
        if not 0 <= float(temperature) <= 100:
            raise ValueError("temperature must be from 0 to 100")
        spec["temperature"] = float(temperature)
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else list(stop)
        if not stops or not all(isinstance(s, str) and s for s in stops):
            raise ValueError("stop must be a non-empty string or list of non-empty strings")
        spec["stop"] = stops
    return Format(spec)


def _specs(items: Iterable[FormatLike]) -> list[dict[str, Any]]:
    return [as_format(x).spec for x in items]


# ---- primitives -------------------------------------------------------------------------------

def const(value: str, **kw: Any) -> Format:
    """Exactly `value` (fast-forwarded by the controller: no sampling)."""
    return _with({"type": "const_string", "value": str(value)}, **kw)


def regex(pattern: str, **kw: Any) -> Format:
    """Text matching `pattern` as a whole (the SDK's regex syntax: docs/writing-controllers.md)."""
    return _with({"type": "regex", "pattern": pattern}, **kw)


def json(schema: Mapping[str, Any] | bool | str = True, *, whitespace: int | None = None,
         complete_by: int | None = None, **kw: Any) -> Format:
    """A JSON document valid under `schema` (a JSON Schema dict, or its text; True: any JSON).
    `whitespace`: up to N whitespace bytes between tokens (default 0, compact). `complete_by`:
    the reply's token budget (e.g. the request's max_tokens): when the reply has no more room left
    than the document's shortest completion and the fixed text after it need, that completion is
    forced (needs a host that grants ff_tokens), so a budget-bound reply still ends valid."""
    spec: dict[str, Any] = {"type": "json_schema",
                            "json_schema": dict(schema) if isinstance(schema, Mapping) else schema}
    if whitespace is not None:
        spec["x-whitespace"] = int(whitespace)
    if complete_by is not None:
        spec["complete_by"] = _nonneg(complete_by, "complete_by")
    return _with(spec, **kw)


def text(*, max_tokens: int | None = None, excludes: Iterable[str] = (), **kw: Any) -> Format:
    """Free text (XGrammar's any_text) that contains none of `excludes` (nor the literal that
    follows it), at most `max_tokens` tokens."""
    spec: dict[str, Any] = {"type": "any_text"}
    if max_tokens is not None:
        spec["max_tokens"] = _nonneg(max_tokens, "max_tokens")
    ex = list(excludes)
    if ex:
        spec["excludes"] = ex
    return _with(spec, **kw)


def gen(*, regex: str | None = None, stop: Iterable[str] | str | None = None, name: str | None = None,
        max_tokens: int | None = None, temperature: float | None = None, capture: str | None = None) -> Format:
    """Generated text: free (until a `stop` string, at most `max_tokens` tokens) or matching
    `regex`. The variable `name` gets the text without the stop string. `max_tokens` bounds free
    text only (a regex bounds itself)."""
    if regex is not None:
        if max_tokens is not None:
            raise ValueError("max_tokens bounds free text; a regex bounds its own length")
        spec: dict[str, Any] = {"type": "regex", "pattern": regex}
    else:
        spec = {"type": "any_text"}
        if max_tokens is not None:
            spec["max_tokens"] = _nonneg(max_tokens, "max_tokens")
    return _with(spec, name=name, capture=capture, temperature=temperature, stop=stop)


def grammar(text: str, **kw: Any) -> Format:
    """Text of a context-free grammar (XGrammar's `grammar` format): Lark as llguidance reads it
    (`start: ...`), or GBNF (`root ::= ...`), compiled by the grammar controller's core
    (docs/grammar.md). A grammar that does not compile is refused on the first call with its line."""
    return _with({"type": "grammar", "grammar": text}, **kw)


def token(t: int | str, **kw: Any) -> Format:
    """One token, by id or by its text (which must be one token of the model's tokenizer)."""
    return _with({"type": "token", "token": t}, **kw)


def exclude_token(tokens: Iterable[int | str] = (), **kw: Any) -> Format:
    """Any one token but these."""
    return _with({"type": "exclude_token", "exclude_tokens": list(tokens)}, **kw)


def any_tokens(exclude: Iterable[int | str] = (), *, max_tokens: int | None = None, **kw: Any) -> Format:
    """Zero or more tokens, none of `exclude`, at most `max_tokens` (<= 256) of them."""
    spec: dict[str, Any] = {"type": "any_tokens", "exclude_tokens": list(exclude)}
    if max_tokens is not None:
        spec["max_tokens"] = _nonneg(max_tokens, "max_tokens")
    return _with(spec, **kw)


# ---- composition ------------------------------------------------------------------------------

def seq(*elements: FormatLike, **kw: Any) -> Format:
    """The elements one after the other."""
    flat: list[dict[str, Any]] = []
    for e in elements:
        s = as_format(e).spec
        plain = s.get("type") == "sequence" and set(s) == {"type", "elements"}
        flat.extend(s["elements"] if plain else [s])     # a + b + c is one sequence
    return _with({"type": "sequence", "elements": flat}, **kw)


def select(options: Iterable[FormatLike], **kw: Any) -> Format:
    """One of the options (strings are literals)."""
    opts = _specs(options)
    if not opts:
        raise ValueError("select needs at least one option")
    return _with({"type": "or", "elements": opts}, **kw)


def optional(content: FormatLike, **kw: Any) -> Format:
    return _with({"type": "optional", "content": as_format(content).spec}, **kw)


def star(content: FormatLike, **kw: Any) -> Format:
    return _with({"type": "star", "content": as_format(content).spec}, **kw)


def plus(content: FormatLike, **kw: Any) -> Format:
    return _with({"type": "plus", "content": as_format(content).spec}, **kw)


def repeat(content: FormatLike, min: int, max: int | None, **kw: Any) -> Format:
    """`content` min to max times (max None: unbounded)."""
    hi = -1 if max is None else _nonneg(max, "max")
    lo = _nonneg(min, "min")
    if hi >= 0 and hi < lo:
        raise ValueError("max is below min")
    return _with({"type": "repeat", "min": lo, "max": hi, "content": as_format(content).spec}, **kw)


def tag(begin: str | Format, content: FormatLike, end: str | list[str] | Format, **kw: Any) -> Format:
    """begin + content + end; free text inside stops at the end string."""
    spec: dict[str, Any] = {"type": "tag", "begin": begin.spec if isinstance(begin, Format) else begin,
                            "content": as_format(content).spec,
                            "end": end.spec if isinstance(end, Format) else end}
    return _with(spec, **kw)


def triggered_tags(triggers: Iterable[str], tags: Iterable[Format], *, at_least_one: bool = False,
                   stop_after_first: bool = False, excludes: Iterable[str] = (), **kw: Any) -> Format:
    """Free text until a trigger, then one of the tags (whose begin starts with that trigger)."""
    spec: dict[str, Any] = {"type": "triggered_tags", "triggers": list(triggers), "tags": _specs(tags),
                            "at_least_one": bool(at_least_one), "stop_after_first": bool(stop_after_first)}
    ex = list(excludes)
    if ex:
        spec["excludes"] = ex
    return _with(spec, **kw)


def tags_with_separator(tags: Iterable[Format], separator: str, *, at_least_one: bool = False,
                        stop_after_first: bool = False, **kw: Any) -> Format:
    """Tags separated by `separator`, nothing else."""
    return _with({"type": "tags_with_separator", "tags": _specs(tags), "separator": separator,
                  "at_least_one": bool(at_least_one), "stop_after_first": bool(stop_after_first)}, **kw)


# ---- steps only this runtime hosts --------------------------------------------------------------

def fork(*branches: FormatLike, **kw: Any) -> Format:
    """Fork the sequence: branch 0 continues on this sequence, branch i on a new one; each then
    goes on with what follows the fork. Up to 16 branches."""
    if not 1 <= len(branches) <= 16:
        raise ValueError("fork takes 1 to 16 branches")
    return _with({"type": "fork", "branches": _specs(branches)}, **kw)


def wait(*variables: str) -> Format:
    """Wait (generating nothing) until every variable is set, e.g. by forked branches."""
    if not variables or not all(isinstance(v, str) and v for v in variables):
        raise ValueError("wait takes one or more variable names")
    return Format({"type": "wait", "vars": list(variables)})


def label(name: str, content: FormatLike) -> Format:
    """`content` with label `name`: a later `backtrack(name, ...)` removes everything generated
    from the start of `content` on."""
    spec = as_format(content).to_json()
    return _with(spec, label=name)


class var:
    """A variable's value as part of a backtrack's text: `backtrack("L", "Answer: ", var("x"))`."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        if not isinstance(name, str) or not name:
            raise ValueError("a variable name is a non-empty string")
        self.name = name

    def __repr__(self) -> str:
        return f"var({self.name!r})"


def backtrack(to: str, *text: str | var) -> Format:
    """Remove the text generated since label `to` (it must come before this step), force `text`
    (strings, and `var(name)`: a variable's value when the step runs; unset: nothing), and go on
    with what follows. The forced text is not matched against the program. Needs a host that
    grants `backtrack` and `ff_tokens` (not vLLM's)."""
    if not isinstance(to, str) or not to:
        raise ValueError("backtrack needs a label name")
    parts: list[Any] = []
    for t in text:
        if isinstance(t, var):
            parts.append({"var": t.name})
        elif isinstance(t, str):
            parts.append(t)
        else:
            raise TypeError(f"backtrack text parts are str or var(name), got {type(t).__name__}")
    return Format({"type": "backtrack", "to": to, "text": parts})


def think(*, max_tokens: int | None = None, begin: str = "<think>", end: str = "</think>", **kw: Any) -> Format:
    """A reasoning section: begin, free text (at most max_tokens tokens, then the end is forced), end."""
    return tag(begin, text(max_tokens=max_tokens), end, **kw)


def structural_tag(fmt: FormatLike) -> dict[str, Any]:
    """XGrammar's request shape, {"type": "structural_tag", "format": F}, as vLLM and SGLang take it."""
    return {"type": "structural_tag", "format": as_format(fmt).to_json()}


def _nonneg(v: int, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{what} must be a non-negative integer")
    return v
