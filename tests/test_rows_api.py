"""The rows API (Runtime.submit_rows) against the object API (Runtime.submit): the same
randomized runs through `aicirt.engine` on the scripted backend, once with the engine's own rows
fast path and once with a reference engine that submits StepInput objects, must give identical
token traces (what each controller saw), tokens, forks, splices, errors, logs and variable
streams. Plus the rows API's own contract: misuse raises before anything runs."""
from __future__ import annotations

import random

import numpy as np
import pytest
from conftest import cpu_seconds, mask_tokens
from scripted import (branch, by_fork_index, log, loop_forever, noop, parse_trace, result, script, spin, splice, stop, trap,
                      var_set)

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


def random_cases(seed: int) -> list:
    rng = random.Random(seed)
    cases = []
    for _ in range(rng.randint(3, 8)):
        prompt = [rng.randrange(32, 250) for _ in range(rng.randint(1, 6))]
        steps = [random_step(rng) for _ in range(rng.randint(1, 8))]
        caps = Capabilities.ALL if rng.random() < 0.8 else Capabilities(rng.randrange(0, int(Capabilities.ALL) + 1))
        cases.append((prompt, steps, caps, rng.randrange(1 << 30)))
    return cases


@pytest.mark.parametrize("seed", range(12))
def test_rows_api_and_object_api_run_identically(make_rt, scripted_wasm, seed):
    cases = random_cases(seed)
    out = []
    for cls in (Engine, ObjectApiEngine):
        rt = make_rt(soft_deadline_s=30.0)   # no "pending": both runs must reach the same steps
        out.append(run_engine(cls, rt, rt.load(scripted_wasm), cases))
    assert out[0] == out[1]


@pytest.mark.parametrize("seed", range(6))
def test_the_c_extension_and_the_cffi_calls_run_identically(make_rt, scripted_wasm, seed, monkeypatch):
    """native/pyrows.c (where Python's headers are installed) against CPool's pure-Python
    submit_rows / finish_rows (AICIRT_PYROWS=0), both APIs, the same random runs."""
    import sysconfig
    from pathlib import Path

    from aicirt.native import pyrows
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():   # then cffi, saying why
        assert pyrows.load() is None and "Python.h" in pyrows.why_not()
        return
    assert pyrows.load() is not None, pyrows.why_not()
    cases = random_cases(100 + seed)
    out = []
    for off in ("0", "1"):
        monkeypatch.setenv("AICIRT_PYROWS", off)
        rt = make_rt(soft_deadline_s=30.0)
        assert (type(rt.pool.submit_rows).__name__ == "builtin_function_or_method") is (off == "1")
        out.append([run_engine(cls, rt, rt.load(scripted_wasm), cases) for cls in (Engine, ObjectApiEngine)])
    assert out[0] == out[1]


def test_the_c_extension_refuses_buffers_too_short_for_their_rows(make_rt, scripted_wasm):
    """pyrows.c reads every array through the buffer protocol and checks its length against the
    rows: a short one is a ValueError, and nothing starts."""
    from aicirt.native import pyrows
    rt = make_rt()
    if pyrows.load() is None:   # no Python headers here: cffi's path (the test above checks why)
        return
    seq = rt.new_request(rt.load(scripted_wasm), script(result(branch(mask=[65])))).spawn()
    reg = rt.registry
    scratch, masks = reg.scratch.take(2), reg.take_masks(2)
    args = (reg.table, np.array([seq.index], np.int64), np.full(2, -1, np.int32), None, masks, rt.mask_words, 1, scratch)
    with pytest.raises(ValueError, match="index"):
        rt.pool.submit_rows(*args)
    with pytest.raises(ValueError, match="masks"):
        rt.pool.submit_rows(reg.table, np.array([seq.index] * 2, np.int64), np.full(2, -1, np.int32), None,
                            masks[:1], rt.mask_words, 1, scratch)
    scratch.busy = False
    out = rt.submit_rows(np.array([seq.index]), np.full(1, -1, np.int32), {0: ([1, 2], 0)}).wait(30.0)
    assert out.kind[0] == RowKind.MASK and mask_tokens(out, 0) == [65]


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


# -- the caller-runs rule (docs/embedding.md): a queued call may run on the waiting caller --------
def _caller_rt(**limits):
    """One worker, so that a long call holds it and the next row stays queued for the caller."""
    limits.setdefault("soft_deadline_s", 30.0)
    return aicirt.Runtime(aicirt.ByteTokenizer(), limits=aicirt.Limits(**limits), workers=1, cache_dir=False,
                          steal=True)


def _hog(rt, ctrl, cpu_s: float):
    """A sequence whose every call spins for about `cpu_s` of CPU, past its first two calls (so it
    has a history, which keeps it on the worker when the wait's deadline is short)."""
    from test_cpu_limits import spin_for_cpu
    seq = rt.new_request(ctrl, arg=script(result(branch(mask=[65])), spin(spin_for_cpu(rt, ctrl, cpu_s),
                                                                       result(branch(mask=[65]))))).spawn()
    for k in range(2):
        assert rt.submit_rows([seq.index], [-1], {0: ([1], 0)} if k == 0 else None).wait(60.0).kind[0] == RowKind.MASK
    return seq


def _short_of(hog) -> float:
    """A wait timeout (s) short of what the caller-runs rule needs to take `hog`'s call (its
    history's longest call, ten times over), long enough for a cheap one."""
    return hog.slot.hist_max_us * 5 / 1e6


def _primed(rt, ctrl, steps):
    """A new sequence of `steps` past its first call and one more (each ran on the worker: a
    sequence with no history is never taken)."""
    seq = rt.new_request(ctrl, arg=script(*steps)).spawn()
    for k in range(2):
        out = rt.submit_rows([seq.index], [-1], {0: ([1], 0)} if k == 0 else None).wait(60.0)
        assert out.kind[0] == RowKind.MASK or out.results[0].status == "ok"
    return seq


def test_the_caller_runs_a_queued_cheap_call_and_gets_the_same_result(scripted_wasm):
    rt = _caller_rt()
    try:
        ctrl = rt.load(scripted_wasm)
        hog = _hog(rt, ctrl, 0.1)   # holds the only worker
        cheap = _primed(rt, ctrl, [result(branch(mask=[65])), result(branch(mask=[66, 67]))])
        before = rt.pool.steals
        out = rt.submit_rows([hog.index, cheap.index], [65, 66]).wait(_short_of(hog))
        assert rt.pool.steals == before + 1       # the cheap row ran here, the hog's on the worker
        assert out.kind[1] == RowKind.MASK and (out.kind[0] == RowKind.MASK or out.results[0].status == "pending")
        assert mask_tokens(out, 1) == [66, 67] and cheap.seen == [1, 66]
        # a first call is never taken, nor a sequence with no call after its first ended yet
        fresh = rt.new_request(ctrl, arg=script(result(branch(mask=[68])))).spawn()
        before = rt.pool.steals
        out = rt.submit_rows([hog.index, fresh.index], [65, -1], {1: ([1], 0)}).wait(_short_of(hog))
        assert rt.pool.steals == before
        assert out.kind[1] == RowKind.MASK or out.results[1].status == "pending"
    finally:
        rt.close()


def test_a_caller_run_call_that_loops_still_ends_by_its_cpu_limit(scripted_wasm):
    rt = _caller_rt(call_timeout_s=0.3)
    try:
        ctrl = rt.load(scripted_wasm)
        hog = _hog(rt, ctrl, 0.1)
        looper = _primed(rt, ctrl, [result(branch(mask=[65])), result(branch(mask=[65])), loop_forever()])
        other = _primed(rt, ctrl, [result(branch(mask=[65]))])
        before = rt.pool.steals
        c0 = cpu_seconds(thread=True)
        timeout = min(0.1, _short_of(hog))
        out = rt.submit_rows([hog.index, looper.index], [65, 65]).wait(timeout)
        why = (timeout, hog.slot.hist_max_us, looper.slot.hist_max_us, out.kind.tolist(), out.results)
        assert rt.pool.steals == before + 1, why   # taken: cheap so far
        assert out.kind[1] == RowKind.OTHER and out.results[1].status == "error", why
        error = out.results[1].error
        # ended by its hard limit: its CPU time, or (on a machine too busy to give this thread a tenth
        # of a core) the limit's wall-clock backstop; the same texts as on a worker
        assert error.startswith("trap: interrupted: ") and "Limits.call_timeout_s" in error, why
        if "over its time limit of 0.3 s" in error:
            assert cpu_seconds(thread=True) - c0 >= 0.25, why   # it ran here, on this thread's CPU clock
        assert out.kind[0] == RowKind.MASK or out.results[0].status == "pending"   # the hog, on the worker
        # the overrun paused taking calls: the next queued cheap row goes to the worker
        out = rt.submit_rows([hog.index, other.index], [65, 65]).wait(60.0)
        assert rt.pool.steals == before + 1 and out.kind[1] == RowKind.MASK, (out.kind.tolist(), out.results)
    finally:
        rt.close()


def test_steal_off_runs_every_call_on_a_worker(scripted_wasm):
    rt = aicirt.Runtime(aicirt.ByteTokenizer(), workers=1, cache_dir=False, steal=False)
    try:
        ctrl = rt.load(scripted_wasm)
        seq = _primed(rt, ctrl, [result(branch(mask=[65]))])
        for _ in range(20):
            assert rt.submit_rows([seq.index], [65]).wait(60.0).kind[0] == RowKind.MASK
        assert rt.pool.steals == 0
    finally:
        rt.close()


def test_a_call_no_worker_was_woken_for_still_runs(scripted_wasm):
    """Back-to-back submit -> wait of a cheap row: the submit wakes no worker (the caller will
    take the call). A wait that then leaves it queued (its deadline too short for the rule)
    wakes one, and a batch never waited for gets one from the epoch clock."""
    import time
    from conftest import guarded_steps
    rt = _caller_rt()
    try:
        ctrl = rt.load(scripted_wasm)
        seq = _primed(rt, ctrl, [result(branch(mask=[65]))])
        for _ in range(5):
            assert rt.submit_rows([seq.index], [65]).wait(60.0).kind[0] == RowKind.MASK
        before = rt.pool.steals
        out = rt.submit_rows([seq.index], [65]).wait(1e-9)   # too short a deadline for the caller-runs rule
        assert rt.pool.steals == before
        for _ in guarded_steps("a worker runs the call the wait left queued"):
            if out.kind[0] == RowKind.MASK or out.results[0].status == "ok":
                break
            out = rt.submit_rows([seq.index], [-1]).wait(0.01)   # late: carries nothing, collects it once done
        for _ in range(5):
            assert rt.submit_rows([seq.index], [65]).wait(60.0).kind[0] == RowKind.MASK
        rt.submit_rows([seq.index], [65])   # never waited for
        for _ in guarded_steps("the epoch clock wakes a worker for the call"):
            if seq.slot.done:
                break
            time.sleep(0.001)
    finally:
        rt.close()


def test_a_fork_keeps_its_parents_caller_runs_history(scripted_wasm):
    rt = _caller_rt()
    try:
        seq = _primed(rt, rt.load(scripted_wasm), [result(branch(mask=[65]))])
        assert rt.submit_rows([seq.index], [65]).wait(60.0).kind[0] == RowKind.MASK
        child = seq.fork()
        assert seq.slot.hist_calls > 0
        assert (child.slot.hist_calls, child.slot.hist_max_us) == (seq.slot.hist_calls, seq.slot.hist_max_us)
        before = rt.pool.steals
        out = rt.submit_rows([child.index], [66]).wait(60.0)
        assert out.kind[0] == RowKind.MASK and rt.pool.steals == before + 1   # taken at its first step as a fork
    finally:
        rt.close()


def test_two_batches_out_at_once_keep_their_own_outcome_arrays(scripted_wasm):
    """Two batches of one size out at once each keep their own per-row arrays (reused per batch
    size, never while a batch has not been waited for)."""
    rt = aicirt.Runtime(aicirt.ByteTokenizer(), workers=1, cache_dir=False)
    try:
        ctrl = rt.load(scripted_wasm)
        a = rt.new_request(ctrl, arg=script(result(branch(mask=[65], temperature=0.5)))).spawn()
        b = rt.new_request(ctrl, arg=script(result(branch(mask=[66], temperature=1.5)))).spawn()
        for k in range(4):
            first = {0: ([1], 0)} if k == 0 else None
            ha = rt.submit_rows([a.index], [-1 if k == 0 else 65], first)
            hb = rt.submit_rows([b.index], [-1 if k == 0 else 66], first)
            oa, ob = ha.wait(60.0), hb.wait(60.0)
            assert oa.kind[0] == ob.kind[0] == RowKind.MASK
            assert (float(oa.temperature[0]), float(ob.temperature[0])) == (0.5, 1.5)
            assert mask_tokens(oa, 0) == [65] and mask_tokens(ob, 0) == [66]
    finally:
        rt.close()


def test_closing_the_runtime_waits_for_a_call_the_caller_is_running(scripted_wasm):
    import threading
    from conftest import guarded_steps
    rt = _caller_rt()
    ctrl = rt.load(scripted_wasm)
    hog = _hog(rt, ctrl, 0.2)
    from test_cpu_limits import spin_for_cpu
    slow = _primed(rt, ctrl, [result(branch(mask=[65])), result(branch(mask=[65])),
                              spin(spin_for_cpu(rt, ctrl, 0.2), result(branch(mask=[66])))])
    handle = rt.submit_rows([hog.index, slow.index], [65, 65])
    got = {}
    waiter = threading.Thread(target=lambda: got.setdefault("out", handle.wait(60.0)))
    waiter.start()
    for _ in guarded_steps("the waiting caller takes the slow call"):   # the only worker runs the hog
        if slow.slot.started:
            break
    rt.close()   # frees every Store: only once the caller's call has ended
    assert slow.slot.done == 1
    waiter.join()
    assert got["out"].kind[1] in (RowKind.MASK, RowKind.OTHER)   # collected, whatever close made of it


def test_a_call_the_caller_took_leaves_no_queue_entry_behind():
    """A call the waiting caller took stayed in the workers' queue, marked taken; once its
    sequence closed, its slot was freed, and a worker reaching that entry later ran a freed slot
    (wasmtime: "object used with the wrong store", or an abort). `bench/js_controller.py` (requests
    that fork and close between hundreds of taken steps, Qwen2's vocabulary, one worker) aborted
    in 3 runs of 3 before the fix; this smaller run of the same shape guards the path (taken calls,
    forks, closes, one worker) in a child process, so that a crash fails this test, not the
    session."""
    import subprocess
    import sys
    from pathlib import Path
    code = (
        "import sys; sys.path.insert(0, %r)\n"
        "import aicirt\n"
        "from aicirt import StepInput\n"
        "from aicirt.build.toolchain import build_cached\n"
        "from _vocabs import qwen_token_bytes\n"
        "from _json_cases import VocabTokenizer\n"
        "tok = VocabTokenizer(*qwen_token_bytes())\n"
        "rt = aicirt.Runtime(tok, limits=aicirt.Limits(soft_deadline_s=30.0, first_call_timeout_s=60.0),\n"
        "                    workers=1, cache_dir=False, steal=True)\n"
        "ctrl = rt.load(build_cached('regex'))\n"
        "prompt, digits = tok.encode('Year: '), tok.encode('194')\n"
        "for _ in range(25):\n"
        "    req = rt.new_request(ctrl, arg=b'(19|20)[0-9]{2}')\n"
        "    seq = req.spawn()\n"
        "    assert rt.submit([StepInput(seq, list(prompt), None)]).wait(60.0).results[0].status == 'ok'\n"
        "    assert seq.memory.data_len(seq.store) > 0\n"
        "    seq.fork().close()\n"
        "    for _ in range(25):\n"
        "        toks = list(prompt)\n"
        "        rt.submit([StepInput(seq, list(toks), None)]).wait(60.0)\n"
        "        for t in digits:\n"
        "            toks.append(t)\n"
        "            assert rt.submit([StepInput(seq, list(toks), t)]).wait(60.0).results[0].status == 'ok'\n"
        "    seq.close(); req.close()\n"
        "assert rt.pool.steals > 0\n"
        "rt.close()\n"
        "print('sound')\n") % str(Path(__file__).resolve().parent)
    out = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "sound", out.stderr[-3000:]


@pytest.mark.timing
def test_workers_spin_between_close_calls_and_sleep_once_they_stop(make_rt, scripted_wasm):
    """A worker spins for the next call about twice as long as calls have been coming apart
    (pool.c spin_for, at most 1 ms after a call): after a burst of back-to-back steps, the
    workers are asleep within a few ms, and an idle runtime uses no CPU (CPU time, not wall)."""
    import time
    rt = make_rt(soft_deadline_s=30.0)
    ctrl = rt.load(scripted_wasm)
    seq = rt.new_request(ctrl, arg=script(result(branch(mask=[65])))).spawn()
    index = np.array([seq.index])
    rt.submit_rows(index, [-1], {0: ([1], 0)}).wait()
    for _ in range(300):    # back to back: the gap from a call's end to the next submit is µs
        assert rt.submit_rows(index, [65]).wait().kind[0] == RowKind.MASK
    time.sleep(0.05)        # past any spin (1 ms) and the ticker's idle ticks' start
    c0 = cpu_seconds()
    time.sleep(0.5)
    assert cpu_seconds() - c0 < 0.05, "an idle runtime's threads used CPU (a worker spinning?)"


def test_scratch_buffers_take_turns_per_size_and_keep_the_sizes_used_last():
    """native.ScratchBuffers: two per batch size in turn, never one still busy; the sizes used
    last kept (the same size twice in a row takes its shortcut past the order's bookkeeping)."""
    from aicirt.native import ScratchBuffers
    sb = ScratchBuffers(sizes=2)
    a = sb.take(1)
    b = sb.take(1)
    assert a is not b and a.busy and b.busy
    c = sb.take(1)                      # a still busy: a fresh one in its place
    assert c is not a and c is not b and c.n == 1
    b.busy = c.busy = False
    assert sb.take(1) is b and sb.take(1) is c
    b.busy = c.busy = False
    two = sb.take(2)
    assert two.n == 2 and sb.take(1) is b   # size 1 is newer than 2 again
    sb.take(3)                              # evicts size 2, the one used longest ago
    c.busy = False
    assert sb.take(1) is c                  # size 1 was kept (its turn: c)
    assert sb.take(2) is not two            # size 2 was not


def test_without_python_headers_the_rows_api_goes_through_cffi_and_says_why(make_rt, scripted_wasm, monkeypatch,
                                                                            caplog):
    """pyrows.load() where sysconfig's include dir has no Python.h: None, the reason logged once
    and kept (pyrows.why_not), and a Runtime's rows API on cffi's path, working."""
    import logging
    import sysconfig

    from aicirt.native import pyrows
    monkeypatch.setattr(pyrows, "_state", {})
    monkeypatch.setattr(sysconfig, "get_paths", lambda *a, **k: {"include": "/nonexistent/include"})
    with caplog.at_level(logging.INFO, logger="aicirt.native"):
        assert pyrows.load() is None
    assert "Python.h" in pyrows.why_not() and "cffi" in caplog.text
    rt = make_rt()
    assert type(rt.pool.submit_rows).__name__ == "method"
    seq = rt.new_request(rt.load(scripted_wasm), script(result(branch(mask=[65])))).spawn()
    out = rt.submit_rows(np.array([seq.index]), np.full(1, -1, np.int32), {0: ([1, 2], 0)}).wait(30.0)
    assert out.kind[0] == RowKind.MASK and mask_tokens(out, 0) == [65]
