"""A request's life in the engine: queued, run, retired once its events are out; failures at
`add_request` leave nothing behind; `abort` ends a request at any point."""
from __future__ import annotations

import gc
import weakref

import pytest
import wasmtime

import aicirt
from aicirt.engine import Engine, FinishEvent, SamplingParams, TokensEvent, VarEvent
from aicirt.engine.backends import ScriptedBackend
from scripted import branch, result, script, stop, var_set

PROMPT = [10, 11, 12, 13]
FOREVER = SamplingParams(max_tokens=10**9, ignore_eos=True)


@pytest.fixture
def engine(runtime):
    with Engine(ScriptedBackend(), runtime) as e:
        yield e


def live_instances(runtime) -> int:
    return len(runtime.registry)


# --- queues and retirement -------------------------------------------------------------------
def test_a_request_waits_for_the_next_step_then_runs(engine, ctrl):
    req = engine.add_request(PROMPT, ctrl, script(result(branch(mask=[65]))), params=SamplingParams(max_tokens=3))
    assert engine.scheduler.num_waiting == 1 and engine.scheduler.num_running == 0
    assert engine.backend.calls == []          # nothing runs before a step
    engine.step()
    assert engine.scheduler.num_waiting == 0 and engine.scheduler.num_running == 1
    assert req.sequences[0].output_tokens == [65]


def test_a_finished_request_is_retired_with_the_step_that_returns_its_events(engine, ctrl, runtime):
    req = engine.add_request(PROMPT, ctrl, script(var_set("k", "v", result(branch(mask=[65]))), stop()))
    first = engine.step()
    assert req in engine.requests and any(isinstance(e, VarEvent) for e in first)
    last = engine.step()                       # the controller stops
    assert [(e.seq.label, e.reason) for e in last if isinstance(e, FinishEvent)] == [(0, "stop")]
    assert engine.requests == [] and not engine.has_unfinished and engine.step() == []
    # the caller's object still has everything; the runtime no longer holds its instance
    assert req.sequences[0].finish_reason == "stop" and req.variables["k"] == b"v"
    assert req.sequences[0].output_tokens == [65] and live_instances(runtime) == 0


def test_the_engine_holds_no_reference_to_a_retired_request(engine, ctrl):
    for controller in (ctrl, None):
        req = engine.add_request(PROMPT, controller, script(result(branch(mask=[65])), stop()),
                                 params=SamplingParams(max_tokens=2))
        ref = weakref.ref(req)
        events = list(engine.run())
        assert any(isinstance(e, FinishEvent) for e in events)
        del req, events                        # the events went out: now only the caller held it
        gc.collect()
        assert ref() is None, gc.get_referrers(ref())


def test_queues_stay_flat_over_many_requests(engine, ctrl, runtime):
    """Requests coming and going: only the live ones are held, whatever came before."""
    keep = engine.add_request(PROMPT, ctrl, script(result(branch(mask=[66]))), params=FOREVER)
    sizes = []
    for k in range(300):
        engine.add_request(PROMPT, ctrl if k % 2 else None, script(result(branch(mask=[65])), stop()),
                           params=SamplingParams(max_tokens=1))
        engine.step()
        sizes.append((len(engine.scheduler), live_instances(runtime)))
    # each step retires the request added one step before: 1 long-lived + at most 2 short ones
    assert max(sizes) <= (3, 3) and sizes[-1] == sizes[-2]
    assert keep.sequences[0].finish_reason is None and len(keep.sequences[0].output_tokens) == 300


# --- add_request failures ----------------------------------------------------------------------
def test_a_bad_module_raises_and_queues_nothing(engine):
    with pytest.raises(aicirt.LoadError):
        engine.add_request(PROMPT, b"\0asm\x01\0\0\0")
    assert engine.requests == [] and not engine.has_unfinished
    assert engine.step() == [] and engine.backend.calls == []   # nothing generates without its controller


@pytest.mark.parametrize("prompt, needle", [([], "no tokens"), ([1, 257], "token 257 is out of range"),
                                             ([-1], "token -1 is out of range")])
def test_a_bad_prompt_raises_and_queues_nothing(engine, ctrl, runtime, prompt, needle):
    with pytest.raises(ValueError, match=needle):
        engine.add_request(prompt, ctrl)
    assert engine.requests == [] and live_instances(runtime) == 0


TRAPPING_INIT = """(module
  (memory (export "memory") 1)
  (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32) (i32.const 1024))
  (func (export "mid-process") (param i32 i32 i32 i32 i32 i32 i32) (result i32) (i32.const 16))
  (func (export "_initialize") unreachable))"""


def test_a_controller_that_fails_to_start_ends_its_only_sequence_and_never_generates(engine, runtime):
    """_initialize runs on a worker with the first call, so its trap ends the sequence at the
    first step, before anything is sampled."""
    bad = runtime.load(wasmtime.wat2wasm(TRAPPING_INIT))
    req = engine.add_request(PROMPT, bad)
    (s,) = req.sequences
    events = engine.step()
    assert s.finish_reason == "error" and s.error.startswith("_initialize: trap: wasm `unreachable`"), s.error
    assert [(type(e), e.reason) for e in events if isinstance(e, FinishEvent)] == [(FinishEvent, "error")]
    assert not any(isinstance(e, TokensEvent) for e in events) and s.output_tokens == []
    assert engine.requests == [] and live_instances(runtime) == 0


def test_add_request_after_close_raises(runtime, ctrl):
    engine = Engine(ScriptedBackend(), runtime)
    engine.close()
    with pytest.raises(ValueError, match="closed"):
        engine.add_request(PROMPT, ctrl)


# --- abort -------------------------------------------------------------------------------------
def test_abort_a_running_request_frees_it_and_spares_the_others(engine, ctrl, runtime):
    doomed = engine.add_request(PROMPT, ctrl, script(result(branch(mask=[65]), branch(mask=[66])),
                                                     result(branch(mask=[68]))), params=FOREVER)
    other = engine.add_request(PROMPT, ctrl, script(result(branch(mask=[67]))), params=FOREVER)
    engine.step()
    engine.step()                              # doomed has forked: two live sequences
    assert len(doomed.sequences) == 2 and live_instances(runtime) == 3
    engine.abort(doomed, "client gone")
    assert all(s.finish_reason == "client gone" and s.cache.freed for s in doomed.sequences)
    assert live_instances(runtime) == 1        # its controllers are closed at once
    events = engine.step()
    finishes = [(e.seq.label, e.reason) for e in events if isinstance(e, FinishEvent)]
    assert finishes == [(0, "client gone"), (1, "client gone")]
    assert not any(isinstance(e, TokensEvent) and e.request is doomed for e in events)
    assert engine.requests == [other] and other.sequences[0].finish_reason is None


def test_abort_a_waiting_request(engine, ctrl, runtime):
    req = engine.add_request(PROMPT, ctrl, script(result(branch(mask=[65]))))
    engine.abort(req)
    assert req.sequences[0].finish_reason == "abort"
    events = list(engine.run())
    assert [(type(e), e.reason) for e in events] == [(FinishEvent, "abort")]
    assert engine.backend.calls == [] and engine.requests == [] and live_instances(runtime) == 0


def test_abort_is_a_no_op_for_finished_unknown_or_twice_aborted_requests(engine, ctrl, runtime):
    done = engine.generate(PROMPT, ctrl, script(stop()))
    engine.abort(done)                         # finished and retired
    assert done.sequences[0].finish_reason == "stop"
    with Engine(ScriptedBackend(), runtime) as elsewhere:
        theirs = elsewhere.add_request(PROMPT, None)
        engine.abort(theirs)                   # held by another engine
        assert theirs.sequences[0].finish_reason is None
    req = engine.add_request(PROMPT, ctrl, script(result(branch(mask=[65]))), params=FOREVER)
    engine.step()
    engine.abort(req)
    engine.abort(req)
    events = engine.step()
    assert [e.reason for e in events if isinstance(e, FinishEvent)] == ["abort"]
    assert engine.step() == [] and engine.requests == []


def test_abort_rejects_a_bad_reason(engine, ctrl):
    req = engine.add_request(PROMPT, ctrl)
    for bad in ("", None, 3):
        with pytest.raises(ValueError, match="reason"):
            engine.abort(req, bad)


@pytest.mark.timing
def test_abort_a_late_controller(scripted_wasm):
    """A call still running past its soft deadline is closed once it returns, not under it."""
    rt = aicirt.Runtime(aicirt.ByteTokenizer(), limits=aicirt.Limits(soft_deadline_s=1e-6, max_late_steps=10_000),
                        cache_dir=False)
    try:
        with Engine(ScriptedBackend(), rt) as engine:
            req = engine.add_request(PROMPT, rt.load(scripted_wasm), script(result(branch(mask=[65]))),
                                     params=FOREVER)
            for _ in range(3):
                engine.step()
            engine.abort(req)
            engine.step()
            assert engine.requests == [] and req.sequences[0].finish_reason == "abort"
    finally:
        rt.close()
