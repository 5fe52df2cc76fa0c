"""The program's shape, checked in Python: `validate(obj)` raises `ProgramError(pointer, why)` for a
malformed program with the same pointer and wording as the `program` controller's first call
("program: at POINTER: WHY"), so that a server answers 400 and a CLI refuses before any model or
controller loads.

What needs the tokenizer or the controller's own compilers is left to the first call (which
refuses the same way): whether a regex or a grammar compiles, whether a JSON Schema is supported, whether a
token's text is one token. `required_capabilities(obj)` says which host capabilities a program
needs (a host that cannot fork refuses a program with a `fork` step before running it).
"""
from __future__ import annotations

import json
from typing import Any

#: Every format type, as the controller lists them in its "unknown type" message.
TYPES = ("const_string", "regex", "json_schema", "grammar", "any_text", "sequence", "or", "optional", "star",
         "plus", "repeat", "tag", "triggered_tags", "tags_with_separator", "token", "exclude_token", "any_tokens",
         "fork", "wait", "backtrack")

MAX_CAPS = 16          # named elements in one program
MAX_LABELS = 8         # labels (backtrack targets) in one program
MAX_REPEAT = 256       # copies of repeated content in one program (the controller unrolls repeats)
INT_MAX = 2147483647


class ProgramError(ValueError):
    """A malformed program: `pointer` is the JSON pointer of the offending element (RFC 6901,
    "/" for the root), `why` what is wrong with it. `str()` is "at POINTER: WHY"."""

    def __init__(self, pointer: str, why: str):
        super().__init__(f"at {pointer}: {why}")
        self.pointer = pointer
        self.why = why


def _seg(key: str | int) -> str:
    return "/" + (str(key) if isinstance(key, int) else key.replace("~", "~0").replace("/", "~1"))


class _Checker:
    def __init__(self) -> None:
        self.caps = 0
        self.repeat_budget = MAX_REPEAT
        self.forks: list[str] = []
        self.backtracks: list[str] = []

    def labels(self, f: Any, ptr: str, seen: list[str]) -> None:
        """Labels and backtracks in document order (the controller's check_labels): a label is
        a non-empty string defined once, a backtrack names a label defined before it."""
        if not isinstance(f, dict):
            return
        if "label" in f:
            lab = f["label"]
            if not isinstance(lab, str) or not lab:
                self.fail(ptr + "/label", "must be a non-empty string")
            if lab in seen:
                self.fail(ptr + "/label", f"label defined twice: {lab}")
            if len(seen) == MAX_LABELS:
                self.fail(ptr + "/label", "over 8 labels in one program")
            seen.append(lab)
        if f.get("type") == "backtrack":
            to = f.get("to")
            if isinstance(to, str) and to not in seen:
                self.fail(ptr + "/to", f"no label before this step is called {to}")
            return
        for k in ("begin", "content", "end"):
            self.labels(f.get(k), ptr + _seg(k), seen)
        for k in ("elements", "tags", "branches"):
            items = f.get(k)
            if isinstance(items, list):
                for i, x in enumerate(items):
                    self.labels(x, ptr + _seg(k) + _seg(i), seen)

    def fail(self, ptr: str, why: str) -> None:
        raise ProgramError(ptr or "/", why)

    def field(self, f: dict, ptr: str, key: str, kind: type | tuple, name: str, required: bool) -> Any:
        if key not in f:
            if required:
                self.fail(ptr, f'missing "{key}"')
            return None
        v = f[key]
        ok = isinstance(v, kind) and not (kind in (int, float) and isinstance(v, bool))
        if not ok:
            self.fail(ptr + _seg(key), f"must be {name}")
        return v

    def flag(self, f: dict, ptr: str, key: str) -> bool:
        return bool(self.field(f, ptr, key, bool, "a boolean", False))

    def uint(self, f: dict, ptr: str, key: str, lo: int) -> int | None:
        v = f.get(key)
        if v is None:
            return None
        is_int = isinstance(v, int) and not isinstance(v, bool) or isinstance(v, float) and v.is_integer()
        if not is_int or not lo <= v <= INT_MAX:
            self.fail(ptr + _seg(key), "must be an integer >= -1" if lo < 0 else "must be a non-negative integer")
        return int(v)

    def strings(self, f: dict, ptr: str, key: str, nonempty_each: bool) -> list[str] | None:
        if key not in f:
            return None
        v = f[key]
        if not isinstance(v, list):
            self.fail(ptr + _seg(key), "must be an array of strings")
        for i, s in enumerate(v):
            if not isinstance(s, str):
                self.fail(ptr + _seg(key) + _seg(i), "must be a string")
            if nonempty_each and not s:
                self.fail(ptr + _seg(key) + _seg(i), "must not be empty")
        return v

    def format(self, f: Any, ptr: str) -> None:
        if not isinstance(f, dict):
            self.fail(ptr, 'a format must be an object with a "type"')
        if "type" not in f:
            self.fail(ptr, 'missing "type"')
        t = f.get("temperature")
        if "temperature" in f and (not isinstance(t, (int, float)) or isinstance(t, bool) or not 0 <= t <= 100):
            self.fail(ptr + "/temperature", "must be a number from 0 to 100")
        self.strings(f, ptr, "stop", True)
        if "name" in f:
            if not isinstance(f["name"], str) or not f["name"]:
                self.fail(ptr + "/name", "must be a non-empty string")
            if "capture" in f and f["capture"] not in ("set", "append"):
                self.fail(ptr + "/capture", 'must be "set" or "append"')
            if self.caps == MAX_CAPS:
                self.fail(ptr, "over 16 named elements in one program")
            self.caps += 1
        self.inner(f, f["type"], ptr)

    def inner(self, f: dict, t: Any, ptr: str) -> None:
        if t == "const_string":
            self.field(f, ptr, "value", str, "a string", True)
        elif t == "regex":
            self.field(f, ptr, "pattern", str, "a string", True)
        elif t == "json_schema":
            if "json_schema" not in f:
                self.fail(ptr, 'missing "json_schema"')
            s = f["json_schema"]
            if isinstance(s, str):
                try:
                    json.loads(s)
                except ValueError:
                    self.fail(ptr + "/json_schema", "not JSON")
            elif not isinstance(s, dict) and s is not True:
                self.fail(ptr + "/json_schema", "must be an object (a JSON Schema)")
            if "style" in f and f["style"] != "json":
                self.fail(ptr + "/style", 'only style "json" is supported')
            self.uint(f, ptr, "complete_by", 0)
        elif t == "grammar":
            self.field(f, ptr, "grammar", str, "a string", True)
        elif t == "any_text":
            self.uint(f, ptr, "max_tokens", 0)
            if f.get("max_chars") is not None:
                self.fail(ptr + "/max_chars", "max_chars is not supported (use max_tokens)")
            self.strings(f, ptr, "excludes", True)
        elif t == "sequence":
            el = self.field(f, ptr, "elements", list, "an array", True)
            for i in reversed(range(len(el))):       # the controller builds back to front
                self.format(el[i], ptr + "/elements" + _seg(i))
        elif t == "or":
            el = self.field(f, ptr, "elements", list, "an array", True)
            if not el:
                self.fail(ptr + "/elements", "must not be empty")
            for i, e in enumerate(el):
                self.format(e, ptr + "/elements" + _seg(i))
        elif t in ("optional", "star", "plus", "repeat"):
            content = self.field(f, ptr, "content", dict, "an object", True)
            lo, hi = (1 if t == "plus" else 0), (1 if t == "optional" else -1)
            if t == "repeat":
                for k in ("min", "max"):
                    if k not in f:
                        self.fail(ptr, f'missing "{k}"')
                lo = self.uint(f, ptr, "min", 0) or 0
                hi_v = self.uint(f, ptr, "max", -1)
                hi = -1 if hi_v is None else hi_v
            if 0 <= hi < lo:
                self.fail(ptr, '"max" is below "min"')
            copies = lo + (1 if hi < 0 else hi - lo)
            if copies > self.repeat_budget:
                self.fail(ptr, "repeat: over 256 copies of the content in the program")
            self.repeat_budget -= copies
            for _ in range(max(copies, 1)):
                self.format(content, ptr + "/content")
                break                                   # the shape is the same in every copy
        elif t == "tag":
            self.tag(f, ptr)
        elif t == "triggered_tags":
            tags = self.field(f, ptr, "tags", list, "an array", True)
            triggers = self.strings(f, ptr, "triggers", True)
            if triggers is None:
                self.fail(ptr, 'missing "triggers"')
            assert triggers is not None
            if not triggers:
                self.fail(ptr + "/triggers", "must not be empty")
            if not tags:
                self.fail(ptr + "/tags", "must not be empty")
            self.flag(f, ptr, "at_least_one")
            self.flag(f, ptr, "stop_after_first")
            self.tags(tags, ptr)
            for i, tg in enumerate(tags):
                begin = tg.get("begin")
                if not (isinstance(begin, str) and any(begin.startswith(x) for x in triggers)):
                    self.fail(ptr + f"/tags/{i}/begin", "does not start with any of the triggers")
            self.strings(f, ptr, "excludes", True)
        elif t == "tags_with_separator":
            tags = self.field(f, ptr, "tags", list, "an array", True)
            self.field(f, ptr, "separator", str, "a string", True)
            if not tags:
                self.fail(ptr + "/tags", "must not be empty")
            self.flag(f, ptr, "at_least_one")
            self.flag(f, ptr, "stop_after_first")
            self.tags(tags, ptr)
        elif t == "token":
            if "token" not in f:
                self.fail(ptr, 'missing "token"')
            self.token(f["token"], ptr + "/token")
        elif t in ("exclude_token", "any_tokens"):
            ex = f.get("exclude_tokens")
            if "exclude_tokens" in f and not isinstance(ex, list):
                self.fail(ptr + "/exclude_tokens", "must be an array")
            if t == "any_tokens":
                mt = self.uint(f, ptr, "max_tokens", 0)
                if mt is not None and mt > 256:
                    self.fail(ptr + "/max_tokens", "any_tokens: max_tokens over 256")
            for i, x in enumerate(ex or []):
                self.token(x, ptr + f"/exclude_tokens/{i}")
        elif t == "fork":
            br = self.field(f, ptr, "branches", list, "an array", True)
            if not 1 <= len(br) <= 16:
                self.fail(ptr + "/branches", "must hold 1 to 16 formats")
            self.forks.append(ptr or "/")
            for i, b in enumerate(br):
                self.format(b, ptr + "/branches" + _seg(i))
        elif t == "backtrack":
            self.field(f, ptr, "to", str, "a string", True)
            text = f.get("text")
            parts = [text] if isinstance(text, str) else text
            if "text" in f and not isinstance(text, (str, list)):
                self.fail(ptr + "/text", 'must be a string or a list of strings and {"var": NAME}')
            for i, x in enumerate(parts or []):
                is_var = isinstance(x, dict) and len(x) == 1 and isinstance(x.get("var"), str) and x["var"]
                if not isinstance(x, str) and not is_var:
                    self.fail(ptr + f"/text/{i}", 'must be a string or {"var": NAME} (a non-empty variable name)')
            self.backtracks.append(ptr or "/")
        elif t == "wait":
            v = self.strings(f, ptr, "vars", True)
            if not v:
                self.fail(ptr, 'missing "vars" (a non-empty list of variable names)')
        elif not isinstance(t, str):
            self.fail(ptr + "/type", "must be a string")
        else:
            self.fail(ptr + "/type", f'unknown type "{t}" (types: {", ".join(TYPES)})')

    def token(self, v: Any, ptr: str) -> None:
        ok = isinstance(v, str) and v or isinstance(v, int) and not isinstance(v, bool) and v >= 0
        if not ok:
            self.fail(ptr, "a token is an id below the vocabulary size or its text")

    def tags(self, tags: list, ptr: str) -> None:
        for i, tg in enumerate(tags):
            p = ptr + f"/tags/{i}"
            if not isinstance(tg, dict):
                self.fail(p, "must be a tag object")
            self.tag(tg, p)

    def tag(self, f: dict, ptr: str) -> None:
        if "type" in f and f["type"] != "tag":
            self.fail(ptr + "/type", 'must be "tag"')
        for k in ("begin", "end", "content"):
            if k not in f:
                self.fail(ptr, f'missing "{k}"')
        end = f["end"]
        if isinstance(end, list):
            self.strings(f, ptr, "end", False)
            if not end:
                self.fail(ptr + "/end", "must not be empty")
        elif isinstance(end, dict):
            self.format(end, ptr + "/end")
        elif not isinstance(end, str):
            self.fail(ptr + "/end", "must be a string, a list of strings or a token format")
        self.format(f["content"], ptr + "/content")
        begin = f["begin"]
        if isinstance(begin, dict):
            self.format(begin, ptr + "/begin")
        elif not isinstance(begin, str):
            self.fail(ptr + "/begin", "must be a string or a token format")


def _root(obj: Any) -> tuple[Any, str]:
    if isinstance(obj, dict) and obj.get("type") == "structural_tag":
        if "format" not in obj:
            raise ProgramError("/", 'missing "format"')
        return obj["format"], "/format"
    return obj, ""


def parse(arg: str | bytes | Any) -> Any:
    """The program as a Python object: JSON text (str or bytes) parsed, anything else as is.
    Raises ProgramError("/", "not JSON: ...") for text that does not parse."""
    if isinstance(arg, (bytes, bytearray)):
        arg = bytes(arg).decode("utf-8", "replace")
    if isinstance(arg, str):
        try:
            return json.loads(arg)
        except ValueError as e:
            raise ProgramError("/", f"not JSON: {e}") from None
    return arg


def _check(obj: Any) -> _Checker:
    f, ptr = _root(parse(obj))
    c = _Checker()
    c.labels(f, ptr, [])
    c.format(f, ptr)
    return c


def validate(obj: Any) -> None:
    """Check a program (a dict from JSON, or its JSON text). Raises `ProgramError(pointer, why)`."""
    _check(obj)


def required_capabilities(obj: Any) -> dict[str, str]:
    """Host capabilities the program needs that hosts may lack, each with the pointer of the first
    step that needs it: {"fork": "/format/elements/1"}; a `backtrack` step needs "backtrack" and
    "ff_tokens". (Token healing uses backtrack only where granted, so no other step needs it.)
    Raises ProgramError for a malformed program."""
    c = _check(obj)
    need = {"fork": c.forks[0]} if c.forks else {}
    if c.backtracks:           # the first the controller builds (a sequence back to front, as here)
        need["backtrack"] = need["ff_tokens"] = c.backtracks[0]
    return need


def capability_refusal(obj: Any, granted: int) -> str | None:
    """Why a host granting only `granted` (`aicirt.Capabilities` flags) cannot run this program,
    worded as the controller words it ("at POINTER: fork needs capability `fork`, which this host
    did not grant"), or None. Raises ProgramError for a malformed program."""
    from ..capabilities import Capabilities

    need = required_capabilities(obj)
    have = Capabilities(granted)
    if "fork" in need and not have & Capabilities.FORK:
        return f"at {need['fork']}: fork needs capability `fork`, which this host did not grant"
    for cap, flag in (("backtrack", Capabilities.BACKTRACK), ("ff_tokens", Capabilities.FF_TOKENS)):
        if cap in need and not have & flag:
            return f"at {need[cap]}: backtrack needs capability `{cap}`, which this host did not grant"
    return None
