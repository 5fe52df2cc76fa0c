"""Streaming tool calls: a choice's growing text turned into OpenAI's incremental deltas.

OpenAI streams a tool call as `delta.tool_calls` entries: first one with the call's `index`, `id`,
`type: "function"` and `function.name` (arguments `""`), then entries with only `index` and a
piece of `function.arguments`; a client concatenates the pieces (the `openai` package's stream
helpers do). Text outside the calls streams as `delta.content`.

`ToolStream(family).feed(text, final)` takes the choice's whole text so far (a prefix of the
final text: the program writes calls whose opening and closing are forced, so what was sent
never changes) and returns the deltas that became certain: content up to where a trigger might
begin, a call's header once its name is complete, its arguments up to where the call's end might
begin. With `final=True` (the choice ended) everything left is released. The deltas add up to
what `tools.parse` makes of the final text: the same content (stripped, as there), the same
names, and the arguments as the model wrote them. Never raises.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from .tools import NAME_RE, Family, new_call_id

_DECODER = json.JSONDecoder()


def _held(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker` (it may become it)."""
    for k in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


@dataclass
class ToolStream:
    """One choice's stream state. `deltas` of `feed` are dicts: `{"content": str}` or
    `{"tool_call": {...}}` (one entry of OpenAI's `delta.tool_calls`)."""
    family: Family
    calls: int = 0                       # calls started (the next call's index)
    _pos: int = 0                        # text consumed up to here
    _state: str = "text"                 # "text", "begin" (a trigger seen), "args", "after"
    _args_at: int = 0                    # where the current call's arguments start
    _args_sent: int = 0                  # characters of them sent
    _started: bool = False               # content sent yet (leading white space is dropped)
    _ws: str = ""                        # white space held back (trailing white space is dropped)
    _out: list[dict] = field(default_factory=list)

    def _content(self, s: str) -> None:
        if not self._started:
            s = s.lstrip()
        body = s.rstrip()
        if body:
            self._out.append({"content": self._ws + body})
            self._started, self._ws = True, s[len(body):]
        else:
            self._ws += s

    def feed(self, text: str, final: bool = False) -> list[dict]:
        fam = self.family
        self._out = []
        while True:
            if self._state == "text":
                at = text.find(fam.trigger, self._pos)
                if at < 0:
                    end = len(text) if final else len(text) - _held(text[self._pos:], fam.trigger)
                    self._content(text[self._pos:end])
                    self._pos = max(self._pos, end)
                    break
                self._content(text[self._pos:at])
                self._pos, self._state = at, "begin"
            elif self._state == "begin":
                head = text[self._pos:]
                opening = fam.begin
                if not head.startswith(opening):
                    if opening.startswith(head) and not final:
                        break                                   # the opening is still being written
                    self._not_a_call(text)
                    continue
                close = head.find('"', len(opening))
                name = head[len(opening):close] if close >= 0 else head[len(opening):]
                rest = f', "{fam.args_key}": '
                if close < 0 or not head.startswith(rest, close + 1):
                    if not final and (close < 0 or rest.startswith(head[close + 1:])) and \
                            (not name or NAME_RE.fullmatch(name)):
                        break
                    self._not_a_call(text)
                    continue
                if not NAME_RE.fullmatch(name):
                    self._not_a_call(text)
                    continue
                self._out.append({"tool_call": {"index": self.calls, "id": new_call_id(), "type": "function",
                                                "function": {"name": name, "arguments": ""}}})
                self._args_at = self._args_sent = self._pos + close + 1 + len(rest)
                self._state = "args"
            elif self._state == "args":
                try:
                    _, end = _DECODER.raw_decode(text, self._args_at)
                except ValueError:
                    end = -1
                if end < 0:
                    stop = len(text) if final else len(text) - _held(text[self._args_sent:], fam.end)
                    self._args(text, stop)
                    if final:
                        self.calls += 1
                    break
                self._args(text, end)
                self.calls += 1
                tail = text[end:]
                closing = fam.end
                if tail.startswith(closing):
                    self._pos, self._state = end + len(closing), "after"
                elif closing.startswith(tail) and not final:
                    self._pos, self._state = end, "closing"
                    break
                else:
                    self._pos, self._state = end, "after"      # no closing: the rest is content
            elif self._state == "closing":
                tail = text[self._pos:]
                if tail.startswith(fam.end):
                    self._pos, self._state = self._pos + len(fam.end), "after"
                elif fam.end.startswith(tail) and not final:
                    break
                else:
                    self._state = "after"
            elif self._state == "after":                      # a separator (llama3's ";") is not content
                sep = fam.separator.strip()
                rest = text[self._pos:]
                stripped = rest.lstrip()
                if sep and stripped.startswith(sep):
                    self._pos += len(rest) - len(stripped) + len(sep)
                elif sep and sep.startswith(stripped) and not final and stripped:
                    break
                elif sep and not stripped and not final:
                    break
                self._state = "text"
        return self._out

    def _args(self, text: str, stop: int) -> None:
        if stop > self._args_sent:
            self._out.append({"tool_call": {"index": self.calls, "function": {"arguments": text[self._args_sent:stop]}}})
            self._args_sent = stop

    def _not_a_call(self, text: str) -> None:
        """The trigger starts no call: it is content."""
        end = self._pos + len(self.family.trigger)
        self._content(text[self._pos:end])
        self._pos, self._state = end, "text"
