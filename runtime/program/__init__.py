"""`aicirt.program`: structured outputs without compiling (docs/program.md).

The `program` controller takes a JSON program (XGrammar's structural-tag formats, plus fork,
wait and captured variables); this package builds such programs in Python, checks them with the
controller's own first call (`validate`: its pointer and wording, no Python copy of its rules),
and runs them on the embedded engine (`run`).
"""
from __future__ import annotations

from .builder import (Format, any_tokens, as_format, backtrack, const, exclude_token, fork, gen, grammar, json, label,
                      optional, plus, regex, repeat, select, seq, star, structural_tag, tag, tags_with_separator, text,
                      think, token, triggered_tags, var, wait)
from .run import ProgramResult, program_arg, run
from .validate import ProgramError, capability_refusal, parse, required_capabilities, validate

from .tools import tool_calls   # OpenAI tools -> the model family's native tool-call format (docs/tools.md)

__all__ = [
    "Format", "ProgramError", "ProgramResult", "any_tokens", "as_format", "backtrack", "capability_refusal", "const",
    "exclude_token", "fork", "gen", "grammar", "json", "label", "var", "optional", "parse", "plus", "program_arg", "regex", "repeat", "required_capabilities", "run",
    "select", "seq", "star", "structural_tag", "tag", "tags_with_separator", "text", "think", "token",
    "tool_calls", "triggered_tags", "validate", "wait",
]
