"""The `program` controller under aicirt's contract fuzzer: random legal engines (random grants,
forks, splices, backtracks, no-op and late steps) never make it trap or return an invalid result."""
from __future__ import annotations

import pytest

from aicirt import program as P
from aicirt.build.toolchain import build_cached

PROGRAMS = {
    "json_then_tag": P.seq(P.json({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}),
                           P.tag("<t>", P.text(max_tokens=5), "</t>")),
    "fork_wait": P.seq("x", P.fork(P.seq(P.wait("v"), "done"), P.gen(regex="[a-c]{1,3}", name="v", stop="."))),
    "triggered": P.triggered_tags(["<f"], [P.tag("<f>", P.regex("[0-9]+"), "</f>")], stop_after_first=True),
    "loops": P.seq(P.star(P.gen(regex="[a-z]", name="c", capture="append")), P.repeat("ab", 1, 3),
                   P.select(["x", "xy"]), P.any_tokens(max_tokens=3)),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_program_survives_the_fuzzer(name, aicirt_fuzz):
    aicirt_fuzz(build_cached("program"), PROGRAMS[name].dumps().encode(), steps=300, seed=1)
