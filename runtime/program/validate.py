"""The one program validator: the `program` controller's own first call, reached from Python.

`validate(program)` runs the controller's first call on the program (its compile: the shape, the
regexes, the JSON Schemas, the grammars, the labels, the limits) and raises `ProgramError` with the
controller's own pointer and words ("program: at POINTER: WHY" in its log). Python keeps no copy
of the rules; this module only parses JSON text and reads the controller's verdict.

The call runs on `runtime` when the caller has one (a server's, over its model's tokenizer: the
verdict is exact), else on a small runtime kept for the process over the byte tokenizer (the
stand-in: one worker, no prebuilt trie, the shipped controller built once and cached). On the
stand-in a refusal that depends on the vocabulary (a token text that is not one token of it, a
token id past its 257 tokens) is not reported: the model's tokenizer may accept it, and the run,
whose first call is on that tokenizer, reports it if it does not. A check costs one first call of
the controller: 0.5-1.7 ms of CPU for a typical program, a remembered answer about 10 µs
(bench/results/program_check.txt).
"""
from __future__ import annotations

import json
import re
import threading
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..core.runtime import Runtime

#: Answers kept per (argument, capabilities) for the stand-in, least recently used out first.
MAX_REMEMBERED = 256
#: How long a check waits for the first call (bounded anyway by Limits.first_call_timeout_s in CPU
#: time and its wall-clock backstop); past it the check has no verdict.
WAIT_S = 60.0

_LINE = re.compile(r"program: (?:at (/\S*): )?(.*)", re.S)


class ProgramError(ValueError):
    """A malformed program: `pointer` is the JSON pointer of the offending element (RFC 6901,
    "/" for the root), `why` what is wrong with it, both as the controller words them. `str()` is
    "at POINTER: WHY"."""

    def __init__(self, pointer: str, why: str):
        super().__init__(f"at {pointer}: {why}")
        self.pointer = pointer
        self.why = why

    @classmethod
    def from_log(cls, log: str) -> ProgramError | None:
        """The error the controller's log reports (its last "program: ..." line, to the end of
        the log: a token text it quotes may hold a newline; without a pointer the line is about
        the whole program, "/"), or None if it reports none."""
        text = log.rstrip("\n")
        at = text.rfind("\nprogram: ") + 1
        if at == 0 and not text.startswith("program: "):
            return None
        m = _LINE.fullmatch(text[at:])
        return cls(m.group(1) or "/", m.group(2)) if m else None


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
        except RecursionError:
            raise ProgramError("/", "not JSON: nested too deeply") from None
    return arg


def argument(program: Any) -> bytes:
    """The controller's argument: `program` (JSON text, or a JSON-ready object) as UTF-8 JSON text.
    Raises ProgramError for text that is not JSON or an object that cannot be written as JSON."""
    obj = parse(program)
    try:
        return json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise ProgramError("/", f"not JSON: {e}") from None
    except RecursionError:
        raise ProgramError("/", "not JSON: nested too deeply") from None


def validate(program: Any, runtime: Runtime | None = None, *, capabilities: int | None = None) -> None:
    """Check a program (a dict from JSON, or its JSON text) with the controller's first call, on
    `runtime` (the caller's; call it from the thread that submits to it) or on the stand-in.
    `capabilities`: what the host grants (`aicirt.Capabilities`; default all). Raises
    `ProgramError` with the controller's pointer and words."""
    err = _verdict(argument(program), runtime, capabilities)
    if err is not None:
        raise err


def capability_refusal(program: Any, granted: int) -> str | None:
    """Why a host granting only `granted` (`aicirt.Capabilities` flags) cannot run this program, as
    the controller words it ("at POINTER: fork needs capability `fork`, which this host did not
    grant"), or None. Raises ProgramError for a malformed program."""
    try:
        validate(program, capabilities=granted)
    except ProgramError as e:
        if "needs capability `" in e.why:
            return str(e)
        raise
    return None


def required_capabilities(program: Any) -> dict[str, str]:
    """Host capabilities the program needs that hosts may lack, each with the pointer of the step
    that needs it, as the controller reports them: {"fork": "/format/elements/1"}; a `backtrack`
    step needs "backtrack" and "ff_tokens". Raises ProgramError for a malformed program."""
    from ..capabilities import Capabilities

    need: dict[str, str] = {}
    for cap, flag in (("fork", Capabilities.FORK), ("backtrack", Capabilities.BACKTRACK)):
        try:
            validate(program, capabilities=Capabilities.ALL & ~flag)
        except ProgramError as e:
            if f"needs capability `{cap}`" not in e.why:
                raise
            need[cap] = e.pointer
    if "backtrack" in need:
        need["ff_tokens"] = need["backtrack"]     # the controller names one step for both
    return need


# -- the controller's first call ----------------------------------------------------------------------
class _StandIn:
    """The process's stand-in runtime (byte tokenizer) with the controller loaded, started on the
    first check; its answers kept per (argument, capabilities). Checks run one at a time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runtime: Any = None
        self.seen: OrderedDict[tuple[bytes, int], ProgramError | None] = OrderedDict()

    def verdict(self, arg: bytes, caps: int) -> ProgramError | None:
        key = (arg, caps)
        with self.lock:
            if key in self.seen:
                self.seen.move_to_end(key)
                return self.seen[key]
            if self.runtime is None:
                from ..core.runtime import Runtime
                from ..host.tokenizer import ByteTokenizer

                self.runtime = Runtime(ByteTokenizer(), workers=1, prebuild_trie=False)
            err = _first_call(self.runtime, arg, caps)
            if err is not None and _vocabulary_bound(err, arg):
                err = None      # the stand-in's vocabulary, not the program: the model may accept it
            self.seen[key] = err
            while len(self.seen) > MAX_REMEMBERED:
                self.seen.popitem(last=False)
            return err


_STAND_IN = _StandIn()
_LOADED: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()   # runtime -> the controller


def _verdict(arg: bytes, runtime: Runtime | None, capabilities: int | None) -> ProgramError | None:
    from ..capabilities import Capabilities

    caps = int(Capabilities.ALL if capabilities is None else capabilities)
    if runtime is None:
        return _STAND_IN.verdict(arg, caps)
    return _first_call(runtime, arg, caps)


def _first_call(runtime: Runtime, arg: bytes, caps: int) -> ProgramError | None:
    """The controller's first call on `arg` (prompt: the EOS token alone): the error its log
    reports when it stops there, or the runtime's error when the call fails otherwise."""
    from ..capabilities import Capabilities
    from ..core.results import StepInput

    ctrl = _LOADED.get(runtime)
    if ctrl is None:
        from ..build.toolchain import build_cached

        ctrl = _LOADED[runtime] = runtime.load(build_cached("program"))
    req = runtime.new_request(ctrl, arg, Capabilities(caps))
    try:
        seq = req.spawn()
        r = runtime.submit([StepInput(seq, [int(runtime.tokenizer.eos_token_id)], None)]).wait(WAIT_S).results[0]
    finally:
        req.close()
    if r.status == "ok" and r.branches:
        return None                      # compiled and running: the program is fine
    if r.status == "pending":
        return None                      # no verdict in time; the run's own first call decides
    found = ProgramError.from_log(r.logs or seq.log.decode("utf-8", "replace"))
    if found is not None:
        return found
    if r.status == "error":
        return ProgramError("/", f"the program controller failed on it: {r.error}")
    return None


def _vocabulary_bound(err: ProgramError, arg: bytes) -> bool:
    """Whether the stand-in refused because of its own vocabulary: a token text that is not one of
    its tokens, or a token id (a non-negative integer) past its 257 tokens."""
    if err.why.startswith("not one token in this tokenizer"):
        return True
    if err.why.startswith("a token is an id below the vocabulary size"):
        v = _at(json.loads(arg), err.pointer)
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0
    return False


def _at(obj: Any, pointer: str) -> Any:
    """The value at a JSON pointer (None where there is none); a structural tag's "/format" prefix
    is part of the pointer as the controller writes it."""
    for part in pointer.split("/")[1:]:
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(obj, list) and key.isdigit() and int(key) < len(obj):
            obj = obj[int(key)]
        elif isinstance(obj, dict) and key in obj:
            obj = obj[key]
        else:
            return None
    return obj
