"""The scheduler's queues on their own: every request in exactly one, retired ones forgotten."""
from __future__ import annotations

import numpy as np
import pytest

from aicirt.engine import GenRequest, GenSeq, SamplingParams, Scheduler
from aicirt.engine.backends.base import KVCache


def make_request(n_seqs: int = 1) -> GenRequest:
    req = GenRequest(id=0, prompt=[1], params=SamplingParams(), rng=np.random.default_rng(0))
    req.sequences = [GenSeq(req, label=k, tokens=[1], cache=KVCache()) for k in range(n_seqs)]
    return req


def queues(s: Scheduler) -> tuple[int, int, int]:
    return s.num_waiting, s.num_running, s.num_finished


def test_waiting_then_running_then_retired():
    s = Scheduler()
    a, b = make_request(), make_request(2)
    s.add(a)
    s.add(b)
    assert queues(s) == (2, 0, 0) and a in s and len(s) == 2
    live = s.schedule()
    assert queues(s) == (0, 2, 0) and live == a.sequences + b.sequences
    b.sequences[0].finish_reason = "stop"
    assert s.schedule() == a.sequences + b.sequences[1:]
    assert s.postprocess() == []              # b still has a live sequence
    b.sequences[1].finish_reason = "eos"
    assert s.postprocess() == [b] and b not in s and list(s) == [a]
    a.sequences[0].finish_reason = "length"
    assert s.postprocess() == [a] and s.is_empty and s.schedule() == []


def test_finished_outside_a_step_is_retired_by_the_next_postprocess():
    s = Scheduler()
    waiting, running, born_finished = make_request(), make_request(), make_request()
    s.add(running)
    s.schedule()
    s.add(waiting)
    born_finished.sequences[0].finish_reason = "error"
    s.add(born_finished)
    assert queues(s) == (1, 1, 1)
    for r in (waiting, running):
        r.sequences[0].finish_reason = "abort"
        s.finish(r)
    s.finish(running)                          # twice: no-op
    assert queues(s) == (0, 0, 3) and s.schedule() == []
    assert set(s.postprocess()) == {waiting, running, born_finished} and s.is_empty


def test_adding_twice_is_an_error():
    s = Scheduler()
    r = make_request()
    s.add(r)
    with pytest.raises(ValueError, match="already added"):
        s.add(r)


def test_drain_lets_go_of_everything():
    s = Scheduler()
    a, b = make_request(), make_request()
    s.add(a)
    s.schedule()
    s.add(b)
    assert s.drain() == [b, a] and s.is_empty and queues(s) == (0, 0, 0)
