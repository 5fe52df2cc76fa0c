"""The stream's text deltas (serve.tracker): whole characters only, exact backtracks, forks, usage."""
from __future__ import annotations

import pytest
from scripted import branch, result, script, splice, stop

from aicirt.engine.backends import ScriptedBackend
from aicirt.engine import Engine
from aicirt.serve.tracker import RunTracker


@pytest.fixture
def engine():
    with Engine(ScriptedBackend()) as e:
        yield e


def run(engine, scripted_wasm, *steps, prompt="P: "):
    req = engine.add_request(prompt, engine.runtime.load(scripted_wasm), script(*steps), chat=False)
    tracker = RunTracker(engine.backend, req)
    updates = []
    while not req.finished:
        u = tracker.update(engine.step())
        if u is not None:
            updates.append(u)
    return req, tracker, updates


def replay(updates) -> dict[int, str]:
    texts: dict[int, str] = {}
    for u in updates:
        for d in u.forks:
            t = texts.get(d.index, "")
            texts[d.index] = (t[:len(t) - d.backtrack] if d.backtrack else t) + d.text
    return texts


def test_split_characters_are_held_back_and_backtracks_count_characters(engine, scripted_wasm):
    # "é" arrives as two byte tokens; then one token is taken back and "è"'s last byte added:
    # the client sees "é", then "take back 1 character, add è".
    req, _, updates = run(engine, scripted_wasm, result(branch(mask=[0xC3])), result(branch(mask=[0xA9])),
                          result(branch(splices=[splice(backtrack=1, ff=[0xA8])])), stop())
    deltas = [(d.text, d.backtrack) for u in updates for d in u.forks]
    assert deltas == [("", 0), ("é", 0), ("è", 1), ("", 0)]
    assert replay(updates) == {0: "è"} == {0: req.sequences[0].text}
    assert updates[-1].finished and updates[-1].forks[0].finish_reason == "stop"
    assert updates[-1].usage.sampled_tokens == 2 and updates[-1].usage.ff_tokens == len("P: ") + 1


def test_each_fork_streams_its_whole_text(engine, scripted_wasm):
    req, _, updates = run(engine, scripted_wasm, result(branch(mask=[65])),
                          result(branch(mask=[66]), branch(mask=[67])), stop())
    assert replay(updates) == {0: "AB", 1: "AC"} == {s.label: s.text for s in req.sequences}
    assert updates[-1].usage.sampled_tokens == 3


def test_variables_and_logs_reach_the_fork_that_wrote_them(engine, scripted_wasm):
    from scripted import log, var_set

    req, tracker, updates = run(engine, scripted_wasm, log("hello", var_set("v", "1", result(branch(mask=[65])))),
                                var_set("v", "2", stop()))
    # (the scripted controller also appends its call trace to variable "trace")
    stores = [[w for w in d.storage if w[1] == "v"] for u in updates for d in u.forks]
    assert [s for s in stores if s] == [[("set", "v", b"1")], [("set", "v", b"2")]]
    assert "hello" in "".join(d.logs for u in updates for d in u.forks)
    assert tracker.variables["v"] == b"2" and tracker.variables["trace"] == req.variables["trace"]
