"""docs/protocol.md#semantics end to end through `aicirt.engine` on the scripted backend.

The controller is tests/controllers/scripted.c: each call runs the next step of a script given
as its argument and appends what it received (backtrack, tokens, sampled, fork-group) to the
variable "trace", so every test can assert the net edit the engine reported. After every step
`check_caches` asserts the engine invariant: each KV cache holds a prefix of its sequence.
"""
from __future__ import annotations

import aicirt
import numpy as np
import pytest
from aicirt import Capabilities
from aicirt.engine.backends import ScriptedBackend
from aicirt.engine import Engine, FinishEvent, ForkEvent, SamplingParams, TokensEvent, VarEvent
from scripted import branch, by_fork_index, noop, parse_trace, result, script, splice, stop, trap, var_set, wait_var

EOS = 256
PROMPT = [10, 11, 12, 13]


def make_engine(runtime, **backend_kw):
    backend = ScriptedBackend(**backend_kw)
    return Engine(backend, runtime), backend


def check_caches(engine):
    for r in engine.requests:
        for s in r.sequences:
            if s.finish_reason is None:
                cached = ScriptedBackend.cached_tokens(s.cache)
                assert cached == s.tokens[:len(cached)], (s.label, cached, s.tokens)


def run(engine, max_steps=200):
    events = []
    for _ in range(max_steps):
        if not engine.has_unfinished:
            break
        events += engine.step()
        check_caches(engine)
    assert not engine.has_unfinished, "engine did not finish"
    return events


def trace(req, seq_id=None):
    out = [(t["backtrack"], t["tokens"], t["sampled"]) for t in parse_trace(req.variables["trace"])
           if seq_id is None or t["seq"] == seq_id]
    return out


def go(engine, ctrl, *steps, prompt=PROMPT, caps=Capabilities.ALL, **params):
    params.setdefault("max_tokens", 8)
    req = engine.add_request(list(prompt), ctrl, script(*steps), capabilities=caps,
                             params=SamplingParams(**params))
    events = run(engine)
    return req, events


# --- docs/protocol.md#semantics rows ---------------------------------------------------------------------------
def test_empty_result_stops(runtime, ctrl):
    engine, _ = make_engine(runtime)
    req, _ = go(engine, ctrl, stop())
    (s,) = req.sequences
    assert s.finish_reason == "stop" and s.tokens == PROMPT and s.error is None


def test_mask_samples_only_allowed_tokens_then_reports_sampled(runtime, ctrl):
    engine, _ = make_engine(runtime, script=b"zzzz")  # the model would say "z"; the mask forbids it
    req, _ = go(engine, ctrl, result(branch(mask=[65, 66])), result(branch(mask=[67])), stop())
    (s,) = req.sequences
    assert s.tokens[len(PROMPT):][1] == 67 and s.tokens[len(PROMPT)] in (65, 66)
    first = s.tokens[len(PROMPT)]
    assert trace(req) == [(0, PROMPT, None), (0, [first], first), (0, [67], 67)]
    assert s.finish_reason == "stop"


def test_branch_temperature_overrides_the_request(runtime, ctrl):
    def logits(tokens):  # token 65 slightly preferred over 66
        out = np.full(257, -50.0, dtype=np.float32)
        out[65], out[66] = 1.0, 0.0
        return out

    engine, _ = make_engine(runtime, logits_fn=logits)
    hot, _ = go(engine, ctrl, result(branch(mask=[65, 66], temperature=50.0)), max_tokens=60, seed=1)
    cold, _ = go(engine, ctrl, result(branch(mask=[65, 66], temperature=0.0)), max_tokens=60, temperature=50.0,
                 seed=1)
    assert set(hot.sequences[0].output_tokens) == {65, 66}
    assert set(cold.sequences[0].output_tokens) == {65}


def test_unconditional_splice_after_sampling_backtracks_the_sampled_token(runtime, ctrl):
    engine, _ = make_engine(runtime, script=b"A")
    req, _ = go(engine, ctrl, result(branch(mask=[65], splices=[splice(backtrack=2, ff=[90, 91])])), stop())
    (s,) = req.sequences
    # sampled 65, then removed it and one prompt token: the controller sees one token backtracked
    assert s.tokens == PROMPT[:-1] + [90, 91]
    assert trace(req) == [(0, PROMPT, None), (1, [90, 91], 65)]


@pytest.mark.parametrize("sampled, expect_tokens, expect_edit", [
    (5, [50, 51], (0, [50, 51], 5)),      # first splice matches: sampled token replaced
    (6, [6, 60], (0, [6, 60], 6)),        # second matches with backtrack 0: kept, then ff
    (7, [7], (0, [7], 7)),                # none matches: the sampled token stays
])
def test_conditional_splices_first_match_wins(runtime, ctrl, sampled, expect_tokens, expect_edit):
    engine, _ = make_engine(runtime, script=bytes([sampled]))
    req, _ = go(engine, ctrl, result(branch(mask=[5, 6, 7], splices=[
        splice(when=[5], backtrack=1, ff=[50, 51]), splice(when=[6, 5], backtrack=0, ff=[60])])), stop())
    (s,) = req.sequences
    assert s.output_tokens == expect_tokens
    assert trace(req)[1] == expect_edit


def test_fast_forward_without_sampling_discards_the_logits(runtime, ctrl):
    engine, backend = make_engine(runtime)
    req, events = go(engine, ctrl, result(branch(splices=[splice(backtrack=1, ff=[20, 21])])), stop())
    (s,) = req.sequences
    assert s.tokens == PROMPT[:-1] + [20, 21]
    assert trace(req) == [(0, PROMPT, None), (1, [20, 21], None)]
    # the backend was asked for exactly the tokens it lacked: the prompt, then the two ff tokens
    assert [c[0][1] for c in backend.calls] == [tuple(PROMPT), (20, 21)]
    tok = [e for e in events if isinstance(e, TokensEvent)]
    assert [(e.backtrack, e.tokens) for e in tok] == [(1, [20, 21])]


def test_pure_backtrack_recomputes_logits_of_the_new_last_token(runtime, ctrl):
    engine, backend = make_engine(runtime)
    req, _ = go(engine, ctrl, result(branch(splices=[splice(backtrack=2)])), result(branch(mask=[65])), stop())
    (s,) = req.sequences
    assert s.tokens == PROMPT[:2] + [65]
    # after backtracking to [10, 11] the cache is cropped to [10] and token 11 is run again;
    # the last forward (65) overlaps the call that stops
    assert [c[0][1] for c in backend.calls] == [tuple(PROMPT), (11,), (65,)]
    assert trace(req) == [(0, PROMPT, None), (2, [], None), (0, [65], 65)]


def test_noop_appends_nothing_and_reuses_logits(runtime, ctrl):
    engine, backend = make_engine(runtime)
    req, _ = go(engine, ctrl, noop(), noop(), result(branch(mask=[65])), stop())
    (s,) = req.sequences
    assert s.output_tokens == [65]
    assert trace(req) == [(0, PROMPT, None), (0, [], None), (0, [], None), (0, [65], 65)]
    assert [c[0][1] for c in backend.calls] == [tuple(PROMPT), (65,)]  # no forward for no-ops


def test_backtrack_into_the_prompt(runtime, ctrl):
    engine, _ = make_engine(runtime)
    req, _ = go(engine, ctrl, result(branch(splices=[splice(backtrack=3, ff=[70])])), stop())
    (s,) = req.sequences
    assert s.tokens == [10, 70] and s.kept_prompt == 1 and s.output_tokens == [70]
    assert trace(req)[1] == (3, [70], None)


def test_backtrack_past_the_start_is_an_error(runtime, ctrl):
    engine, _ = make_engine(runtime)
    req, _ = go(engine, ctrl, result(branch(splices=[splice(backtrack=5)])))
    (s,) = req.sequences
    assert s.finish_reason == "error" and "past the start" in s.error


def test_fork_with_distinct_masks_copies_the_cache_per_branch(runtime, ctrl):
    engine, backend = make_engine(runtime)
    req, events = go(engine, ctrl,
                     result(branch(mask=[65]), branch(mask=[66]), branch(splices=[splice(backtrack=1, ff=[67, 68])])),
                     by_fork_index(result(branch(mask=[1])), result(branch(mask=[2])), result(branch(mask=[3]))),
                     stop())
    a, b, c = req.sequences
    assert [x.tokens[len(PROMPT) - 1:] for x in (a, b, c)] == [[13, 65, 1], [13, 66, 2], [67, 68, 3]]
    assert [x.finish_reason for x in (a, b, c)] == ["stop"] * 3
    assert [e.child.label for e in events if isinstance(e, ForkEvent)] == [1, 2]
    group = [a.seq_id, b.seq_id, c.seq_id]
    full = parse_trace(req.variables["trace"])
    firsts = {t["seq"]: (t["backtrack"], t["tokens"], t["sampled"], t["fork_group"]) for t in reversed(full[1:])}
    assert firsts == {a.seq_id: (0, [65], 65, group), b.seq_id: (0, [66], 66, group),
                      c.seq_id: (1, [67, 68], None, group)}
    # one forward call per step for all three branches, each from its own cache
    assert len(backend.calls[1]) == 3
    assert len({uid for uid, _ in backend.calls[1]}) == 3


def test_variables_across_forks_and_a_noop_wait(runtime, ctrl):
    engine, _ = make_engine(runtime)
    req, events = go(engine, ctrl,
                     result(branch(mask=[1]), branch(mask=[2])),
                     by_fork_index(wait_var("answer", var_set("seen", "yes", stop())), result(branch(mask=[3]))),
                     by_fork_index(stop(), var_set("answer", "42", stop())))
    parent, child = req.sequences
    assert req.variables["answer"] == b"42" and req.variables["seen"] == b"yes"
    assert parent.finish_reason == child.finish_reason == "stop"
    assert parent.output_tokens == [1] and child.output_tokens == [2, 3]
    # the parent no-op'd (nothing appended) while the child generated; forks run concurrently,
    # so whether the parent sees the child's variable in the same step or the next is a race
    waits = trace(req, parent.seq_id)[2:]
    assert trace(req, parent.seq_id)[1] == (0, [1], 1) and waits in ([(0, [], None)], [(0, [], None)] * 2)
    names = [(e.seq_id, e.name) for e in events if isinstance(e, VarEvent) and e.name != "trace"]
    assert names == [(child.seq_id, "answer"), (parent.seq_id, "seen")]


def test_controller_error_beside_healthy_sequences(runtime, ctrl):
    engine, _ = make_engine(runtime, script=b"ab")
    bad = engine.add_request(PROMPT, ctrl, script(result(branch(mask=[65])), trap()),
                             params=SamplingParams(max_tokens=5))
    good = engine.add_request(PROMPT, None, params=SamplingParams(max_tokens=5))
    forked = engine.add_request(PROMPT, ctrl, script(result(branch(mask=[1]), branch(mask=[2])),
                                                     by_fork_index(trap(), result(branch(mask=[3])))),
                                params=SamplingParams(max_tokens=4))
    run(engine)
    (b,) = bad.sequences
    assert b.finish_reason == "error" and b.error and b.output_tokens == [65]
    assert good.sequences[0].finish_reason == "length" and len(good.sequences[0].output_tokens) == 5
    p, c = forked.sequences
    assert p.finish_reason == "error" and c.finish_reason == "length" and c.output_tokens == [2, 3, 3, 3]


@pytest.mark.parametrize("caps, steps, needle", [
    (Capabilities.ALL & ~Capabilities.FORK, [result(branch(mask=[1]), branch(mask=[2]))], "fork"),
    (Capabilities.ALL & ~Capabilities.BACKTRACK, [result(branch(splices=[splice(backtrack=1)]))], "backtrack"),
    (Capabilities.ALL & ~Capabilities.FF_TOKENS, [result(branch(splices=[splice(ff=[5])]))], "ff-tokens"),
    (Capabilities.ALL & ~Capabilities.CONDITIONAL_FF_TOKENS,
     [result(branch(mask=[1], splices=[splice(when=[1], ff=[5])]))], "conditional"),
])
def test_capability_refusals_end_only_that_sequence(runtime, ctrl, caps, steps, needle):
    engine, _ = make_engine(runtime)
    refused = engine.add_request(PROMPT, ctrl, script(*steps), capabilities=caps)
    fine = engine.add_request(PROMPT, ctrl, script(result(branch(mask=[9])), stop()))
    run(engine)
    (s,) = refused.sequences
    assert s.finish_reason == "error" and needle in s.error
    assert fine.sequences[0].finish_reason == "stop" and fine.sequences[0].output_tokens == [9]


def test_eos_and_max_tokens(runtime, ctrl):
    engine, _ = make_engine(runtime)
    eos, _ = go(engine, ctrl, result(branch(mask=[65])), result(branch(mask=[EOS])))
    assert eos.sequences[0].finish_reason == "eos" and eos.sequences[0].output_tokens == [65, EOS]
    length, _ = go(engine, ctrl, result(branch(mask=[65])), max_tokens=3)
    assert length.sequences[0].finish_reason == "length" and length.sequences[0].output_tokens == [65] * 3
    # fast-forwarded tokens count too, and a fast-forward past the budget is cut there
    ff, _ = go(engine, ctrl, result(branch(splices=[splice(ff=[1, 2])])), max_tokens=3)
    assert ff.sequences[0].finish_reason == "length" and ff.sequences[0].output_tokens == [1, 2, 1]


def test_endless_noop_ends_with_an_error(runtime, ctrl):
    engine, _ = make_engine(runtime)
    req, _ = go(engine, ctrl, noop(), max_idle_steps=5)
    assert req.sequences[0].finish_reason == "error" and "no-op" in req.sequences[0].error


@pytest.mark.timing   # which calls are late depends on scheduling; the output must not
def test_late_controllers_noop_and_give_the_same_output(runtime, scripted_wasm):
    """A soft deadline of 1 µs makes most calls late ("pending"): the engine no-ops those steps
    and applies each late result at a later step, so the output is the same, only slower."""
    steps = (result(branch(mask=[65, 66, 67])), result(branch(mask=[68], splices=[splice(backtrack=2, ff=[1])])),
             result(branch(mask=[65, 66, 67])), stop())
    outputs = []
    for limits in (aicirt.Limits(), aicirt.Limits(soft_deadline_s=1e-6, max_late_steps=10_000)):
        rt = aicirt.Runtime(aicirt.ByteTokenizer(), limits=limits, cache_dir=False)
        try:
            engine = Engine(ScriptedBackend(seed=3), rt)
            req = engine.add_request(PROMPT, rt.load(scripted_wasm), script(*steps),
                                     params=SamplingParams(max_tokens=10))
            run(engine, max_steps=5000)
            outputs.append((req.sequences[0].tokens, trace(req), req.sequences[0].finish_reason))
        finally:
            rt.close()
    assert outputs[0] == outputs[1]


def test_plain_and_controlled_requests_share_one_forward_per_step(runtime, ctrl):
    engine, backend = make_engine(runtime, script=b"xy")
    plain = engine.add_request(PROMPT, None, params=SamplingParams(max_tokens=3))
    ctl = engine.add_request(PROMPT, ctrl, script(result(branch(mask=[65]))), params=SamplingParams(max_tokens=3))
    run(engine)
    assert plain.sequences[0].output_tokens == [ord("x"), ord("y"), ord("x")]
    assert ctl.sequences[0].output_tokens == [65, 65, 65]
    assert [len(c) for c in backend.calls] == [2, 2, 2]


def test_seeded_sampling_is_reproducible(runtime, ctrl):
    outs = []
    for seed in (7, 7, 8):
        engine, _ = make_engine(runtime)
        req = engine.generate(PROMPT, ctrl, script(result(branch(mask=list(range(65, 91))))),
                              params=SamplingParams(max_tokens=12, temperature=1.0, seed=seed))
        outs.append(req.sequences[0].output_tokens)
    assert outs[0] == outs[1] and outs[0] != outs[2]


def test_finish_events_and_text(runtime, ctrl):
    engine, _ = make_engine(runtime)
    req, events = go(engine, ctrl, result(branch(splices=[splice(ff=list(b"hi"))])), stop())
    fin = [e for e in events if isinstance(e, FinishEvent)]
    assert [(e.seq.label, e.reason) for e in fin] == [(0, "stop")]
    assert req.sequences[0].text == "hi"
