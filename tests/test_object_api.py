"""The object API (`Runtime.submit([StepInput...])`) over the rows API: each sequence's controller
is shown exactly the token list the caller gives, whatever the caller does to that list between
steps (append the sampled token, edit it in place, shorten it, hand over a new list, mix in the
rows API), while the common step (the list it held plus the sampled token) goes through as a plain
row. Checked against the controller's own record of what it was shown (`Sequence.seen`)."""
from __future__ import annotations

import random

import numpy as np
import pytest

from aicirt import StepInput

from scripted import branch, result, script


@pytest.fixture
def seqs(make_rt, scripted_wasm):
    rt = make_rt()
    ctrl = rt.load(scripted_wasm)
    out = [rt.new_request(ctrl, script(result(branch(mask=[65, 66])))).spawn() for _ in range(4)]
    return rt, out


def step(rt, items) -> None:
    out = rt.submit(items).wait()
    assert [r.status for r in out.results] == ["ok"] * len(items), [r.error for r in out.results]
    for item in items:
        assert item.seq.seen == list(item.tokens)


@pytest.mark.parametrize("seed", range(6))
def test_the_controller_sees_the_callers_list_whatever_it_does(seqs, seed):
    rt, live = seqs
    rng = random.Random(seed)
    lists = [[rng.randrange(256) for _ in range(rng.randint(1, 40))] for _ in live]
    step(rt, [StepInput(s, t) for s, t in zip(live, lists)])
    for k in range(60):
        items = []
        for s, t in zip(live, lists):
            op = rng.random()
            sampled = rng.randrange(256)
            if op < 0.55:                      # the common step
                t.append(sampled)
            elif op < 0.65:                    # a splice: backtrack, fast-forward, in place
                del t[max(1, len(t) - rng.randint(0, 4)):]
                t.extend(rng.randrange(256) for _ in range(rng.randint(0, 5)))
                t.append(sampled)
            elif op < 0.75 and len(t) > 2:     # an in-place edit in the middle, same length
                t[rng.randrange(len(t) - 1)] = rng.randrange(256)
                t.append(sampled)
            elif op < 0.85:                    # a new list object with the same tokens
                t[:] = list(t) + [sampled]
            elif op < 0.92:                    # nothing sampled, nothing changed
                sampled = None
            else:                              # the sampled token is not the list's last
                t.append(rng.randrange(256))
            items.append(StepInput(s, t, sampled))
        if k % 7 == 3:                         # the rows API between two object-API steps
            index = np.array([s.index for s in live], np.int64)
            edits = {0: ([1, 2, 3], 0)}
            rt.submit_rows(index, np.full(len(live), 65, np.int32), edits).wait()
            lists[0][:] = [1, 2, 3]
            for t in lists[1:]:
                t.append(65)
            items = [StepInput(s, t, None) for s, t in zip(live, lists)]
        step(rt, items)


def test_bad_tokens_end_only_their_sequence(seqs):
    rt, (a, b, c, d) = seqs
    step(rt, [StepInput(s, [1, 2, 3]) for s in (a, b, c, d)])
    out = rt.submit([StepInput(a, [1, 2, 3, 4], 4), StepInput(b, [1, 2, 3, 1.5], 7),
                     StepInput(c, [1, 2, 3, 999], 999), StepInput(d, [1, 2, -1, 5], 5)]).wait()
    assert [r.status for r in out.results] == ["ok", "error", "error", "error"]
    assert "1.5" in out.results[1].error and "999" in out.results[2].error and "-1" in out.results[3].error
    assert a.seen == [1, 2, 3, 4]


def test_a_refused_batch_leaves_every_list_to_compare_again(seqs):
    rt, (a, b, *_) = seqs
    step(rt, [StepInput(a, [1, 2]), StepInput(b, [1, 2])])
    with pytest.raises(ValueError, match="twice"):
        rt.submit([StepInput(a, [1, 2, 3], 3), StepInput(a, [1, 2, 3], 3)])
    handle = rt.submit([StepInput(b, [1, 2, 3], 3)])
    with pytest.raises(ValueError, match="not been waited for|still"):
        rt.submit([StepInput(a, [1, 2, 3], 3), StepInput(b, [1, 2, 3, 4], 4)])
    handle.wait()
    step(rt, [StepInput(a, [1, 2, 9], 9), StepInput(b, [1, 2, 3, 4], 4)])


def _python_calls(fn) -> int:
    """How many Python and builtin (C) function calls `fn()` makes on this thread (a profiler
    hook counts them: a count, not a time, so the machine's load does not move it)."""
    import sys
    count = 0

    def hook(frame, event, arg):
        nonlocal count
        if event in ("call", "c_call"):
            count += 1
    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


def test_a_steps_python_work_does_not_grow_with_the_token_lists(seqs):
    """The object API's step costs the caller's thread the same number of calls whether each
    sequence holds 10 tokens or 5,000: the common row (the list the controller holds plus the
    sampled token) and a splice at the list's tail are both found without a Python loop over the
    list (docs/embedding.md: the object API is a thin layer over the rows API in cost too)."""
    rt, live = seqs
    counts = {}
    for length in (10, 5000):
        lists = [[1 + (k * 7 + j) % 200 for j in range(length)] for k in range(len(live))]
        step(rt, [StepInput(s, t) for s, t in zip(live, lists)])   # the prompt: an edit from 0, once
        per_step = []
        for k in range(-2, 6):   # two steps to warm up (the batch's scratch arrays are made on first use)
            for t in lists:
                t.append(65 + k % 2)
            if k % 3 == 2:                 # a splice at the tail of one list: backtrack 2, one new token
                del lists[0][-3:]
                lists[0] += [70, 65 + k % 2]
            items = [StepInput(s, t, t[-1]) for s, t in zip(live, lists)]
            calls = _python_calls(lambda: rt.submit(items).wait())
            if k >= 0:
                per_step.append(calls)
            for item in items:
                assert item.seq.seen == item.tokens
        counts[length] = per_step
    assert counts[5000] == counts[10], counts


@pytest.mark.parametrize("seed", range(4))
def test_hinted_lists_and_the_rows_api_in_between(seqs, seed):
    """With the engine's `unchanged` hint (the least length the list was cut back to since the
    last submit) the controller sees the same lists; a hinted common row (one token appended) goes
    through as a plain row, and one whose controller the rows API moved on meanwhile (the hot path
    finds it stale) is compared from the hint instead."""
    rt, live = seqs
    rng = random.Random(seed)
    lists = [[rng.randrange(256) for _ in range(rng.randint(1, 20))] for _ in live]
    step(rt, [StepInput(s, t) for s, t in zip(live, lists)])
    for k in range(40):
        if k % 5 == 4:   # the rows API appends a token to every controller's list
            index = np.array([s.index for s in live], np.int64)
            rt.submit_rows(index, np.full(len(live), 66, np.int32)).wait()
            for t in lists:
                t.append(66)
        items = []
        for s, t in zip(live, lists):
            unchanged = len(t)
            sampled = rng.randrange(256)
            if rng.random() < 0.25:   # a splice: cut back, then fast-forward
                del t[max(1, len(t) - rng.randint(1, 3)):]
                unchanged = len(t)
                t.extend(rng.randrange(256) for _ in range(rng.randint(0, 2)))
            t.append(sampled)
            hinted = rng.random() < 0.8
            items.append(StepInput(s, t, sampled, unchanged if hinted else None))
        step(rt, items)


def test_a_closed_sequence_whose_index_was_reused_is_refused_not_run(seqs):
    """The common row is checked in one C call by its slot index; a closed sequence's index can
    already address a new sequence. Submitting the closed one, with the very list that would be
    its common row (and with the `unchanged` hint), raises "closed" and runs nothing: in
    particular not the new sequence that took its index."""
    rt, (a, b, *_) = seqs
    step(rt, [StepInput(a, [1, 2]), StepInput(b, [1, 2])])
    old_index = a.index
    a.close()
    c = b.request.spawn()   # takes the freed index
    assert c.index == old_index
    for unchanged in (None, 2):
        with pytest.raises(ValueError, match=f"sequence {a.id} is closed"):
            rt.submit([StepInput(b, [1, 2, 3], 3, unchanged), StepInput(a, [1, 2, 3], 3, unchanged)])
        assert c.calls == 0 and b.calls == 1
    step(rt, [StepInput(b, [1, 2, 3], 3), StepInput(c, [4])])


def test_a_sequence_closed_while_its_call_runs_is_refused(seqs):
    rt, (a, *_) = seqs
    step(rt, [StepInput(a, [1, 2])])
    handle = rt.submit([StepInput(a, [1, 2, 3], 3)])
    a.close()   # closing: its call may still run
    with pytest.raises(ValueError, match=f"sequence {a.id} is closed"):
        rt.submit([StepInput(a, [1, 2, 3, 4], 4)])
    assert handle.wait().results[0].status == "error"


def test_token_lists_may_be_tuples_or_numpy_arrays(seqs):
    """StepInput.tokens as a tuple or a numpy array: the same lists reach the controller (a numpy
    array made the common-row comparison raise "truth value of an array is ambiguous")."""
    rt, (a, b, c, _) = seqs
    lists = {a: [1, 2, 3], b: [1, 2, 3], c: [1, 2, 3]}
    kinds = {a: tuple, b: lambda t: np.array(t, dtype=np.int64), c: lambda t: np.array(t, dtype=np.int32)}
    step(rt, [StepInput(s, kinds[s](t)) for s, t in lists.items()])
    for k in range(6):
        for s, t in lists.items():
            if k == 3:
                t[1] = 9   # an edit in place
            t.append(65 + k % 2)
        items = [StepInput(s, kinds[s](t), t[-1], len(t) - 1 if k == 4 else None) for s, t in lists.items()]
        out = rt.submit(items).wait()
        assert [r.status for r in out.results] == ["ok"] * 3, [r.error for r in out.results]
        for s, t in lists.items():
            assert s.seen == t
