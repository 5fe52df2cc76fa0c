"""docs/protocol.md#semantics row by row at the runtime level: what each result lifts to, net edits, forks, variables."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from conftest import mask_tokens
from scripted import (branch, by_fork_index, host_info, noop, parse_trace, result, script, splice, stop, var_set,
                      wait_var)

from aicirt import Capabilities, StepInput


def start(rt, wasm, *steps, caps=Capabilities.ALL):
    req = rt.new_request(rt.load(wasm), arg=script(*steps), capabilities=caps)
    return req, req.spawn()


def step(rt, seq, tokens, sampled=None):
    out = rt.submit([StepInput(seq, tokens, sampled)]).wait()
    return out, out.results[0]


def test_empty_result_stops(rt, scripted_wasm):
    _, seq = start(rt, scripted_wasm, stop())
    _, r = step(rt, seq, [1, 2])
    assert r.status == "ok" and r.branches == [] and r.is_stop and seq.finished


def test_mask_and_temperature(rt, scripted_wasm):
    _, seq = start(rt, scripted_wasm, result(branch(mask=[65, 66])), result(branch(mask=[7, 256], temperature=0.25)))
    out, r = step(rt, seq, [1])
    assert r.status == "ok" and r.branches[0].temperature is None
    assert mask_tokens(out, r.branches[0].mask_row) == [65, 66]
    out, r = step(rt, seq, [1, 65], 65)
    assert r.branches[0].temperature == 0.25
    assert mask_tokens(out, r.branches[0].mask_row) == [7, 256]


def test_fast_forward_without_sampling(rt, scripted_wasm):
    _, seq = start(rt, scripted_wasm, result(branch(splices=[splice(backtrack=1, ff=[10, 11])])))
    _, r = step(rt, seq, [1, 2, 3])
    (b,) = r.branches
    assert b.mask_row is None and not b.is_noop
    assert (b.splices[0].backtrack, b.splices[0].ff_tokens, b.splices[0].when_sampled) == (1, (10, 11), ())


def test_noop(rt, scripted_wasm):
    _, seq = start(rt, scripted_wasm, noop())
    _, r = step(rt, seq, [1])
    assert r.status == "ok" and r.branches[0].is_noop


def test_conditional_splices_are_lifted_in_order(rt, scripted_wasm):
    _, seq = start(rt, scripted_wasm, result(branch(mask=[5, 6, 7], splices=[
        splice(when=[5], backtrack=1, ff=[50, 51]), splice(when=[6, 7], backtrack=2, ff=[60])])))
    out, r = step(rt, seq, [1, 2])
    (b,) = r.branches
    assert mask_tokens(out, b.mask_row) == [5, 6, 7]
    assert [(s.when_sampled, s.backtrack, s.ff_tokens) for s in b.splices] == [((5,), 1, (50, 51)), ((6, 7), 2, (60,))]


def test_net_edit_reported_to_controller(rt, scripted_wasm):
    req, seq = start(rt, scripted_wasm, result(branch(mask=[65])))
    step(rt, seq, [1, 2, 3])                 # prompt
    step(rt, seq, [1, 2, 3, 65], 65)         # sampled and appended
    step(rt, seq, [1, 2, 9, 9], 66)          # engine backtracked 2 then appended 9 9
    step(rt, seq, [1, 2, 9, 9])              # nothing changed (a no-op step)
    step(rt, seq, [1])                       # backtrack into the prompt
    trace = parse_trace(req.variables["trace"])
    assert [(t["backtrack"], t["tokens"], t["sampled"]) for t in trace] == [
        (0, [1, 2, 3], None), (0, [65], 65), (2, [9, 9], 66), (0, [], None), (3, [], None)]


def test_fork_with_distinct_masks_and_fork_group(rt, scripted_wasm):
    req, seq = start(rt, scripted_wasm,
                     result(branch(mask=[65]), branch(mask=[66], temperature=0.0), branch(splices=[splice(ff=[67])])),
                     by_fork_index(result(branch(mask=[1])), result(branch(mask=[2])), result(branch(mask=[3]))))
    out, r = step(rt, seq, [10])
    assert len(r.branches) == 3 and len(r.forks) == 2
    assert mask_tokens(out, r.branches[0].mask_row) == [65]
    assert mask_tokens(out, r.branches[1].mask_row) == [66] and r.branches[1].temperature == 0.0
    assert r.branches[2].mask_row is None and r.branches[2].splices[0].ff_tokens == (67,)
    a, b = r.forks
    out = rt.submit([StepInput(seq, [10, 65], 65), StepInput(a, [10, 66], 66), StepInput(b, [10, 67], None)]).wait()
    assert [mask_tokens(out, x.branches[0].mask_row) for x in out.results] == [[1], [2], [3]]
    trace = parse_trace(req.variables["trace"])
    group = [seq.id, a.id, b.id]
    assert sorted((t["seq"], t["backtrack"], t["tokens"], t["sampled"], t["fork_group"]) for t in trace[1:]) == [
        (seq.id, 0, [65], 65, group), (a.id, 0, [66], 66, group), (b.id, 0, [67], None, group)]
    out = rt.submit([StepInput(a, [10, 66, 2], 2)]).wait()
    assert parse_trace(req.variables["trace"])[-1]["fork_group"] == []


def test_variables_shared_across_forks_and_streamed(rt, scripted_wasm):
    req, seq = start(rt, scripted_wasm,
                     result(branch(mask=[1]), branch(mask=[2])),
                     by_fork_index(wait_var("answer", stop()), var_set("answer", "42", stop())))
    _, r = step(rt, seq, [0])
    child = r.forks[0]
    out = rt.submit([StepInput(seq, [0, 1], 1)]).wait()          # parent waits: the variable is not set yet
    assert out.results[0].branches[0].is_noop
    out = rt.submit([StepInput(child, [0, 2], 2)]).wait()        # the child sets it and stops
    assert out.results[0].is_stop and req.variables["answer"] == b"42"
    out = rt.submit([StepInput(seq, [0, 1], None)]).wait()       # now the parent sees it and stops
    assert out.results[0].is_stop
    changes = [(sid, op, name) for sid, op, name, _ in req.take_var_changes() if name != "trace"]
    assert changes == [(child.id, "set", "answer")]
    assert req.take_var_changes() == []


def test_host_imports(rt, scripted_wasm):
    req, seq = start(rt, scripted_wasm, host_info(stop()), caps=Capabilities.FORK | Capabilities.BACKTRACK)
    step(rt, seq, [0])
    import struct
    info = struct.unpack("<8I", req.variables["info"])
    vocab, eos, caps, sid, n_tok, first_tok, n_detok, trie_len = info
    assert (vocab, eos, caps, sid) == (257, 256, 3, seq.id)
    assert (n_tok, first_tok, n_detok) == (2, ord("h"), 2)
    assert trie_len > 257


@pytest.mark.parametrize("caps, res, needle", [
    (Capabilities.ALL & ~Capabilities.FORK, result(branch(mask=[1]), branch(mask=[2])), "`fork`"),
    (Capabilities.ALL & ~Capabilities.BACKTRACK, result(branch(splices=[splice(backtrack=1)])), "`backtrack`"),
    (Capabilities.ALL & ~Capabilities.FF_TOKENS, result(branch(splices=[splice(ff=[3])])), "`ff-tokens`"),
    (Capabilities.ALL & ~Capabilities.CONDITIONAL_FF_TOKENS,
     result(branch(mask=[1], splices=[splice(when=[1], ff=[3])])), "`conditional-ff-tokens`"),
])
def test_capability_refusals(rt, scripted_wasm, caps, res, needle):
    _, seq = start(rt, scripted_wasm, res, caps=caps)
    _, r = step(rt, seq, [0, 0])
    assert r.status == "error" and needle in r.error and "not granted" in r.error and seq.finished


def test_backtrack_limits(rt, scripted_wasm):
    # with a mask, the sampled token counts: 2 prompt tokens + 1 sampled = 3 may be removed
    _, ok = start(rt, scripted_wasm, result(branch(mask=[1], splices=[splice(backtrack=3)])))
    assert step(rt, ok, [0, 0])[1].status == "ok"
    _, bad = start(rt, scripted_wasm, result(branch(mask=[1], splices=[splice(backtrack=4)])))
    r = step(rt, bad, [0, 0])[1]
    assert r.status == "error" and "past the start" in r.error


def test_finished_sequence_reports_error(rt, scripted_wasm):
    _, seq = start(rt, scripted_wasm, stop())
    step(rt, seq, [1])
    r = step(rt, seq, [1])[1]
    assert r.status == "error"


@pytest.mark.parametrize("tokens, sampled", [([1, 999], None), ([1, -1], None), ([1, 2], 257), ([1, 2.5], None)])
def test_bad_step_input_ends_only_that_sequence(rt, scripted_wasm, tokens, sampled):
    ctrl = rt.load(scripted_wasm)
    bad = rt.new_request(ctrl, arg=script(result(branch(mask=[65])))).spawn()
    good = rt.new_request(ctrl, arg=script(result(branch(mask=[65])))).spawn()
    out = rt.submit([StepInput(bad, tokens, sampled), StepInput(good, [1, 2], None)]).wait()
    assert out.results[0].status == "error" and "not a token id" in out.results[0].error
    assert out.results[1].status == "ok" and bad.finished and bad.calls == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 4), st.lists(st.integers(0, 255), max_size=4)), min_size=1, max_size=8))
def test_unchanged_hint_gives_the_same_net_edits(rt, scripted_wasm, edits):
    """Random backtrack+append edits: with the engine's `unchanged` hint the controller sees
    exactly the edits it sees from the full comparison."""
    ctrl = rt.load(scripted_wasm)
    plain = rt.new_request(ctrl, arg=script(result(branch(mask=[65]))))
    hinted = rt.new_request(ctrl, arg=script(result(branch(mask=[65]))))
    a, b = plain.spawn(), hinted.spawn()
    tokens, unchanged = [1, 2, 3], 0
    for backtrack, new in [(0, [])] + edits:
        keep = max(0, len(tokens) - backtrack)
        tokens = tokens[:keep] + new
        unchanged = min(unchanged, keep)
        rt.submit([StepInput(a, tokens, None), StepInput(b, tokens, None, unchanged)]).wait()
        unchanged = len(tokens)
    strip = lambda req: [(t["backtrack"], t["tokens"]) for t in parse_trace(req.variables["trace"])]  # noqa: E731
    assert strip(plain) == strip(hinted)


def test_bad_unchanged_hint_is_refused(rt, scripted_wasm):
    seq = rt.new_request(rt.load(scripted_wasm), arg=script(result(branch(mask=[65])))).spawn()
    r = rt.submit([StepInput(seq, [1, 2], None, 5)]).wait().results[0]
    assert r.status == "error" and "unchanged=5" in r.error


def test_post_return_runs_after_every_result_and_is_part_of_a_fork(rt):
    """Post-return of a lifted result (here a fast-forward) runs on the worker before the next
    call; a fork made before it has run copies it with the state, so the child agrees."""
    from hostile.wat import module, splice as ff_splice
    counted = module(ff_splice(ff=(66,)) + " (i32.store (i32.const 3200) (i32.add (i32.const 65) (global.get $posts)))",
                     post="(global.set $posts (i32.add (global.get $posts) (i32.const 1)))",
                     extra="(global $posts (mut i32) (i32.const 0))")
    seq = rt.new_request(rt.load(counted), capabilities=Capabilities.ALL).spawn()
    seen = [1]
    for expect in (65, 66):
        _, r = step(rt, seq, list(seen))
        assert r.status == "ok" and r.branches[0].splices[0].ff_tokens == (expect,), r.error
        seen.append(expect)
    child = seq.fork()        # the parent's last post-return has not run yet
    for s in (seq, child):
        _, r = step(rt, s, list(seen))
        assert r.status == "ok" and r.branches[0].splices[0].ff_tokens == (67,), r.error
