"""The rows API (Runtime.submit_rows) against the object API (Runtime.submit): the same
randomized runs through `aicirt.engine` on the scripted backend, once with the engine's own rows
fast path and once with a reference engine that submits StepInput objects, must give identical
token traces (what each controller saw), tokens, forks, splices, errors, logs and variable
streams, on both hot paths. Plus the rows API's own contract: misuse raises before anything runs."""
from __future__ import annotations

import random

import numpy as np
import pytest
from scripted import branch, by_fork_index, log, noop, parse_trace, result, script, splice, stop, trap, var_set

import aicirt
from aicirt import Capabilities, RowKind, StepInput
from aicirt.engine import Engine, SamplingParams, VarEvent
from aicirt.engine.backends import ScriptedBackend


class ObjectApiEngine(Engine):
    """The reference: the same engine, but submitting through the object API (a StepInput per
    sequence, the full token list) and handing every result over as a rare row."""

    def _submit(self, controlled):
        if not controlled:
            return None
        handle = self.runtime.submit([StepInput(s.ctrl, s.tokens, s.sampled) for s in controlled])
        for s in controlled:
            s.unchanged = s.synced = len(s.tokens)
            s.sampled = None
        return _AsRows(handle)


class _AsRows:
    def __init__(self, handle):
        self.handle = handle

    def wait(self):
        out = self.handle.wait()
        n = len(out.results)
        return aicirt.RowsOutcome(out.masks, np.full(n, RowKind.OTHER, np.uint8), np.full(n, np.nan, np.float32),
                                  np.array([r.elapsed_us for r in out.results]), dict(enumerate(out.results)),
                                  out.wait_us, out.blocked_us)


def random_step(rng: random.Random, depth: int = 0) -> list[int]:
    tok = lambda: rng.randrange(32, 250)   # noqa: E731
    k = rng.random()
    if k < 0.35:
        return result(branch(mask=sorted({tok() for _ in range(rng.randint(1, 4))}),
                             temperature=rng.choice([None, 0.0, 0.7])))
    if k < 0.5:
        when = [tok() for _ in range(rng.randint(0, 2))]
        return result(branch(mask=[tok(), tok()], splices=[splice(backtrack=rng.randint(0, 2),
                                                                   ff=[tok() for _ in range(rng.randint(0, 3))],
                                                                   when=when)]))
    if k < 0.6:
        return result(branch(splices=[splice(backtrack=rng.randint(0, 3), ff=[tok() for _ in range(rng.randint(1, 3))])]))
    if k < 0.68:
        return noop()
    if k < 0.76 and depth == 0:
        return result(*[branch(mask=[tok()]) for _ in range(rng.randint(2, 3))])
    if k < 0.82:
        return var_set(f"v{rng.randrange(3)}", f"x{rng.randrange(100)}", random_step(rng, depth + 1))
    if k < 0.88:
        return log(f"step {rng.randrange(1000)}", random_step(rng, depth + 1))
    if k < 0.9:
        return by_fork_index(random_step(rng, depth + 1), random_step(rng, depth + 1))
    if k < 0.92:
        return trap()
    if k < 0.94:
        return stop()
    return result(branch(mask=[tok()]))


def run_engine(cls, runtime, ctrl, cases):
    engine = cls(ScriptedBackend(), runtime)
    reqs = [engine.add_request(prompt, ctrl, script(*steps), capabilities=caps,
                               params=SamplingParams(max_tokens=12, seed=seed, temperature=0.8, max_idle_steps=4))
            for prompt, steps, caps, seed in cases]
    events = []
    for _ in range(300):
        if not engine.has_unfinished:
            break
        events += engine.step()
    assert not engine.has_unfinished
    return [[(s.label, s.parent, s.tokens, s.finish_reason, s.error, s.logs) for s in r.sequences]
            + [_renumbered(r.variables)] for r in reqs], [(e.name, e.value) for e in events if isinstance(e, VarEvent) and e.name != "trace"]


def _renumbered(variables: dict) -> dict:
    """The variables with the trace as each sequence's own list of calls (worker threads append
    to it in any order), seq ids (a process-wide counter) replaced by their rank (creation order)."""
    trace = parse_trace(variables.get("trace", b""))
    rank = {seq: k for k, seq in enumerate(sorted({t["seq"] for t in trace} | {g for t in trace for g in t["fork_group"]}))}
    per_seq: dict[int, list] = {}
    for t in trace:
        per_seq.setdefault(rank[t["seq"]], []).append(
            (t["backtrack"], t["tokens"], t["sampled"], [rank[g] for g in t["fork_group"]]))
    return {**variables, "trace": per_seq}


@pytest.mark.parametrize("seed", range(12))
def test_rows_api_and_object_api_run_identically(make_rt, scripted_wasm, seed):
    rng = random.Random(seed)
    cases = []
    for _ in range(rng.randint(3, 8)):
        prompt = [rng.randrange(32, 250) for _ in range(rng.randint(1, 6))]
        steps = [random_step(rng) for _ in range(rng.randint(1, 8))]
        caps = Capabilities.ALL if rng.random() < 0.8 else Capabilities(rng.randrange(0, int(Capabilities.ALL) + 1))
        cases.append((prompt, steps, caps, rng.randrange(1 << 30)))
    out = []
    for cls in (Engine, ObjectApiEngine):
        rt = make_rt(soft_deadline_s=30.0)   # no "pending": both runs must reach the same steps
        out.append(run_engine(cls, rt, rt.load(scripted_wasm), cases))
    assert out[0] == out[1]


def test_rows_masks_and_temperatures_come_back_as_arrays(make_rt, scripted_wasm):
    rt = make_rt(soft_deadline_s=30.0)
    ctrl = rt.load(scripted_wasm)
    a = rt.new_request(ctrl, arg=script(result(branch(mask=[65], temperature=0.5)))).spawn()
    b = rt.new_request(ctrl, arg=script(result(branch(mask=[66, 67])))).spawn()
    c = rt.new_request(ctrl, arg=script(log("hello", result(branch(mask=[68]))))).spawn()
    index = np.array([a.index, b.index, c.index])
    out = rt.submit_rows(index, [-1, -1, -1], {0: ([1, 2], 0), 1: ([1], 0), 2: ([3], 0)}).wait()
    assert out.kind.tolist() == [RowKind.MASK, RowKind.MASK, RowKind.OTHER]
    assert out.temperature[0] == 0.5 and np.isnan(out.temperature[1])
    bits = lambda row: [t for t in range(256) if row[t // 32] >> (t % 32) & 1]   # noqa: E731
    assert bits(out.masks[0]) == [65] and bits(out.masks[1]) == [66, 67]
    assert out.results[2].logs == "hello" and bits(out.masks[out.results[2].branches[0].mask_row]) == [68]
    assert set(out.results) == {2}
    # the common row: only the sampled token; each controller saw its own edit
    out = rt.submit_rows(index, [65, 66, 68]).wait()
    assert a.seen == [1, 2, 65] and b.seen == [1, 66] and c.seen == [3, 68]
    assert out.kind.tolist() == [RowKind.MASK, RowKind.MASK, RowKind.OTHER]   # c logs on every call


def test_rows_misuse_raises_before_anything_runs(make_rt, scripted_wasm):
    rt = make_rt(soft_deadline_s=30.0)
    ctrl = rt.load(scripted_wasm)
    a, b = (rt.new_request(ctrl, arg=script(result(branch(mask=[65])))).spawn() for _ in range(2))
    with pytest.raises(ValueError, match="submitted twice"):
        rt.submit_rows([a.index, b.index, a.index], [-1, -1, -1])
    with pytest.raises(ValueError, match="not a sequence of this runtime"):
        rt.submit_rows([a.index, 999], [-1, -1])
    with pytest.raises(TypeError):
        rt.submit_rows([0.5], [-1])
    with pytest.raises(ValueError, match="entries for 2 rows"):
        rt.submit_rows([a.index, b.index], [-1])
    handle = rt.submit_rows([a.index], [-1], {0: ([1], 0)})
    with pytest.raises(ValueError, match="not been waited for"):
        rt.submit_rows([b.index, a.index], [-1, -1])
    assert b.calls == 0   # nothing ran for the refused batch
    handle.wait()
    with pytest.raises(ValueError, match="once"):
        handle.wait()
    index = a.index
    a.close()
    with pytest.raises(ValueError, match="closed"):
        rt.submit_rows([index], [-1])
    # a bad token is the engine's mistake: it ends only that row's sequence
    out = rt.submit_rows([b.index], [1 << 20], {0: ([1], 0)}).wait()
    assert out.kind[0] == RowKind.OTHER and "not a token id" in out.results[0].error
    # every row whose token list holds a bad token ends, the others run
    c, d, e = (rt.new_request(ctrl, arg=script(result(branch(mask=[65])))).spawn() for _ in range(3))
    out = rt.submit_rows([c.index, d.index, e.index], [-1, -1, -1],
                         {0: ([1, 999], 0), 1: ([2], 0), 2: ([3, 1 << 30], 0)}).wait()
    assert out.kind.tolist() == [RowKind.OTHER, RowKind.MASK, RowKind.OTHER]
    assert "token 999 " in out.results[0].error and f"token {1 << 30} " in out.results[2].error
