"""aicirt.core.speculate: speculation against plain stepping, in lockstep, for every shipped controller.

Two requests of the same controller and argument run side by side over a byte tokenizer: the
plain one steps token by token (the object API), the speculating one drafts after each mask
(`Speculation.extend`, drafts mostly inside the mask so that chains get long), accepts a random
prefix of every length (`commit`), and steps once. At every committed call the two must agree:
result (kind, mask, temperature, splices, error), the tokens the controller saw, the variables,
the log. The rejected drafts are checked too: every draft mask is compared with a replay that
steps through those drafts plainly.
"""
from __future__ import annotations

import numpy as np
import pytest
from scripted import branch, log, parse_trace, result, script, splice, stop, trap, var_set
from test_controllers import FUZZED

import aicirt
from aicirt import Capabilities, StepInput
from aicirt.build import toolchain
from aicirt.core.results import StepResult, splice_for
from aicirt.core.speculate import ENDED_NOT_ALLOWED, ENDED_RESULT, Speculation

NO_FORK = Capabilities.ALL & ~Capabilities.FORK
#: the fuzzed program without its fork step (fork is not granted here)
ARGS = {**{name: arg for name, (arg, _) in FUZZED.items()},
        "program": b'{"type": "sequence", "elements": [{"type": "or", "elements": [{"type": "const_string", '
                   b'"value": "a"}, {"type": "regex", "pattern": "[0-9]{1,3}", "name": "n"}]}, '
                   b'{"type": "const_string", "value": "!"}, {"type": "any_text", "max_tokens": 3}]}'}
EOS = 256


@pytest.fixture(scope="module")
def rt():
    r = aicirt.Runtime(aicirt.ByteTokenizer(), limits=aicirt.Limits(soft_deadline_s=5.0), cache_dir=False)
    yield r
    r.close()


@pytest.fixture(scope="module")
def wasm():
    return {name: toolchain.build_cached(name) for name in FUZZED}


def _allowed(mask: np.ndarray) -> np.ndarray:
    return np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little"))


def _view(r: StepResult, masks: np.ndarray) -> tuple:
    """What a result says, comparable across sequences (mask rows by content)."""
    def one(b):
        return (None if b.mask_row is None else masks[b.mask_row].tobytes(), b.temperature,
                tuple((s.when_sampled, s.backtrack, tuple(s.ff_tokens)) for s in b.splices))
    return r.status, r.error, tuple(one(b) for b in r.branches), r.logs


class Side:
    """One request stepped by the object API: its full token list and last sampled token."""

    def __init__(self, rt, ctrl, arg, prompt, caps=NO_FORK):
        self.rt = rt
        self.req = rt.new_request(ctrl, arg, caps)
        self.seq = self.req.spawn()
        self.tokens, self.sampled = list(prompt), None

    def call(self) -> tuple[StepResult, tuple, np.ndarray]:
        out = self.rt.submit([StepInput(self.seq, list(self.tokens), self.sampled)]).wait(timeout_s=30)
        r = out.results[0]
        return r, _view(r, out.masks), out.masks.copy()

    def take(self, token: int | None) -> None:
        self.sampled = token
        if token is not None:
            self.tokens.append(token)


def _replay(rt, ctrl, arg, caps, history: list[tuple[list[int], int | None]], prompt, drafts: list[int]
            ) -> list[tuple]:
    """A fresh plain sequence through `history` (each call's token list and sampled token), then
    the drafts: the view of each draft's result."""
    side = Side(rt, ctrl, arg, prompt, caps)
    try:
        side.call()
        for tokens, sampled in history:
            side.tokens, side.sampled = list(tokens), sampled
            side.call()
        views = []
        for d in drafts:
            side.take(d)
            views.append(side.call()[1])
        return views
    finally:
        side.req.close()


def _vars(side: "Side") -> dict:
    """The request's variables; scripted.c's "trace" (every call's input) with its seq-ids as
    whether the call was this sequence's own (the two sides' sequences have different ids)."""
    out = dict(side.req.variables)
    if "trace" in out:
        out["trace"] = [{**c, "seq": c["seq"] == side.seq.id} for c in parse_trace(out["trace"])]
    return out


def lockstep(rt, ctrl, arg, seed: int, caps=NO_FORK, prompt=b"Q: ", k_max=5, max_tokens=24, replay_every=3) -> dict:
    """Run plain and speculating side by side; assert they agree. Returns counts for the caller."""
    rng = np.random.default_rng(seed)
    prompt = list(prompt)
    plain, spec = Side(rt, ctrl, arg, prompt, caps), Side(rt, ctrl, arg, prompt, caps)
    history: list[tuple[list[int], int | None]] = []   # each committed call after the first: tokens, sampled
    stats = {"speculations": 0, "with_drafts": 0, "drafts": 0, "accepted": 0, "ended_by_result": 0, "replayed": 0}
    try:
        r_p, v_p, masks_p = plain.call()
        r_s, v_s, _ = spec.call()
        steps = 0
        while True:
            assert v_p == v_s
            assert plain.seq.seen == spec.seq.seen
            assert _vars(plain) == _vars(spec)
            steps += 1
            if r_p.status != "ok" or not r_p.branches or steps > 3 * max_tokens:
                return stats
            b = r_p.branches[0]
            if b.mask_row is None:   # fast-forward (backtrack not granted beyond the splice's own)
                s = b.splices[0]
                for side in (plain, spec):
                    del side.tokens[len(side.tokens) - s.backtrack:]
                    side.tokens.extend(s.ff_tokens)
                    side.sampled = None
                history.append((list(plain.tokens), None))
                r_p, v_p, masks_p = plain.call()
                r_s, v_s, _ = spec.call()
                continue
            m0 = masks_p[b.mask_row]
            token_after: int
            if not b.splices and len(plain.tokens) - len(prompt) < max_tokens:
                # speculate on the speculating side, drafting mostly inside each mask as it comes
                stats["speculations"] += 1
                sp = Speculation(rt, np.array([spec.seq.index]))
                masks, drafts, mask = [m0], [], m0
                for _ in range(int(rng.integers(0, k_max + 1))):
                    allowed = _allowed(mask)
                    d = int(rng.choice(allowed)) if rng.random() < 0.85 and len(allowed) else int(rng.integers(0, EOS))
                    drafts.append(d)
                    out = sp.extend(np.array([d]), allowed=mask[None, :])
                    if not out.ok[0]:
                        assert out.ended[0] in (ENDED_RESULT, ENDED_NOT_ALLOWED), out.ended
                        break
                    mask = out.masks[0].copy()
                    masks.append(mask)
                drafted = sp.drafted[0]
                n = len(drafted)
                assert drafted == drafts[:n]
                stats["drafts"] += n
                stats["ended_by_result"] += sp.ended_result(0) is not None
                stats["with_drafts"] += n > 0
                if n and stats["with_drafts"] % replay_every == 1:
                    # every draft mask, rejected ones included, against plain stepping through the drafts
                    stats["replayed"] += 1
                    views = _replay(rt, ctrl, arg, caps, history, prompt, drafted)
                    for j, v in enumerate(views):
                        assert v[0] == "ok" and len(v[2]) == 1 and v[2][0][0] == masks[j + 1].tobytes(), j
                a = int(rng.integers(0, n + 1)) if rng.random() < 0.7 else n
                stats["accepted"] += a
                logs = sp.draft_logs(0)
                sp.commit(np.array([a]))
                for j in range(a):   # plain: the accepted drafts, one call each, must give the draft masks
                    plain.take(drafted[j])
                    r, v, mk = plain.call()
                    assert v[0] == "ok" and len(v[2]) == 1 and not v[2][0][2], v
                    assert v[2][0][0] == masks[j + 1].tobytes() and v[3] == logs[j]
                    history.append((list(plain.tokens), drafted[j]))
                spec.tokens.extend(drafted[:a])
                spec.sampled = None
                assert spec.seq.seen == plain.tokens
                m = masks[a]
                if a == n and sp.ended_result(0) is not None and len(drafts) > n:
                    token_after = drafts[n]   # the draft whose result ended it: plain must meet that result
                else:
                    allowed = _allowed(m)
                    token_after = int(rng.choice(allowed))
            else:
                allowed = _allowed(m0)
                token_after = int(rng.choice(allowed))
            for side in (plain, spec):
                side.take(token_after)
                sp_ = splice_for(b.splices, token_after)
                if sp_ is not None:
                    del side.tokens[len(side.tokens) - sp_.backtrack:]
                    side.tokens.extend(sp_.ff_tokens)
            history.append((list(plain.tokens), plain.sampled))
            if token_after == EOS:
                return stats
            r_p, v_p, masks_p = plain.call()
            r_s, v_s, _ = spec.call()
    finally:
        plain.req.close()
        spec.req.close()


@pytest.mark.parametrize("name", sorted(FUZZED))
def test_speculation_matches_plain_stepping_for_every_shipped_controller(rt, wasm, name):
    ctrl = rt.load(wasm[name])
    arg = ARGS[name]
    totals = {"speculations": 0, "drafts": 0, "accepted": 0, "replayed": 0}
    for seed in range(8):   # fork not granted (this host keeps one sequence a request); half with masks only
        stats = lockstep(rt, ctrl, arg, seed, caps=NO_FORK if seed % 2 else Capabilities(0))
        for k in totals:
            totals[k] += stats[k]
    assert totals["speculations"] > 5 and totals["drafts"] > 5, totals
    assert totals["replayed"] > 0, totals


ALL_BYTES = list(range(256))


@pytest.mark.parametrize("steps", [
    # variables and logs on every call, then a trap: an error inside the drafts ends them there
    [var_set("a", "1", log("one", result(branch(mask=ALL_BYTES)))), result(branch(mask=list(range(65, 91)))),
     var_set("a", "22", result(branch(mask=ALL_BYTES))), log("four", result(branch(mask=ALL_BYTES))),
     var_set("b", "x", result(branch(mask=ALL_BYTES))), result(branch(mask=ALL_BYTES)), trap()],
    # a stop inside the drafts, after a conditional splice (which ends a speculation at its mask)
    [result(branch(mask=ALL_BYTES)), result(branch(mask=ALL_BYTES, splices=[splice(when=[66], ff=[1, 2])])),
     result(branch(mask=ALL_BYTES)), result(branch(mask=ALL_BYTES)), result(branch(mask=ALL_BYTES)), stop()],
    # fast-forward, temperatures
    [result(branch(mask=ALL_BYTES, temperature=0.5)), result(branch(splices=[splice(ff=[70, 71])])),
     result(branch(mask=[70, 71, 72], temperature=1.5)), result(branch(mask=ALL_BYTES))],
], ids=["vars-logs-trap", "splice-stop", "ff-temperature"])
def test_speculation_matches_plain_stepping_on_scripted_controllers(rt, scripted_wasm, steps):
    ctrl = rt.load(scripted_wasm)
    totals = {"drafts": 0, "ended_by_result": 0}
    for seed in range(12):
        stats = lockstep(rt, ctrl, script(*steps), seed, caps=NO_FORK, k_max=6, replay_every=1)
        for k in totals:
            totals[k] += stats[k]
    assert totals["drafts"] > 10 and totals["ended_by_result"] > 0, totals


def test_commit_keeps_the_index_and_frees_every_fork(rt, scripted_wasm):
    ctrl = rt.load(scripted_wasm)
    req = rt.new_request(ctrl, script(var_set("v", "k", result(branch(mask=ALL_BYTES)))), NO_FORK)
    seq = req.spawn()
    rt.submit([StepInput(seq, [1, 2, 3])]).wait(timeout_s=30)
    before, index = rt.live_sequences, seq.index
    with Speculation(rt, np.array([index])) as sp:
        n_ok, masks, _ = sp.run(np.array([[5, 6, 7, -1]]))
        assert n_ok.tolist() == [3] and rt.live_sequences == before + 3
        sp.commit(np.array([2]))
    assert rt.live_sequences == before and seq.index == index
    assert seq.seen == [1, 2, 3, 5, 6] and rt.registry.at(index) is seq
    trace = parse_trace(req.variables["trace"])
    assert [c["sampled"] for c in trace] == [None, 5, 6] and all(c["seq"] == seq.id for c in trace)
    out = rt.submit([StepInput(seq, [1, 2, 3, 5, 6, 9], 9)]).wait(timeout_s=30)
    assert out.results[0].status == "ok" and seq.seen == [1, 2, 3, 5, 6, 9]
    req.close()


def test_misuse_raises_and_changes_nothing(rt, scripted_wasm):
    ctrl = rt.load(scripted_wasm)
    req = rt.new_request(ctrl, script(result(branch(mask=ALL_BYTES))), NO_FORK)
    seq = req.spawn()
    with pytest.raises(ValueError, match="first call"):
        Speculation(rt, np.array([seq.index]))
    handle = rt.submit([StepInput(seq, [1])])
    with pytest.raises(ValueError, match="idle"):
        Speculation(rt, np.array([seq.index]))
    handle.wait(timeout_s=30)
    with pytest.raises(ValueError, match="twice"):
        Speculation(rt, np.array([seq.index, seq.index]))
    with pytest.raises(ValueError):
        Speculation(rt, np.array([10_000]))
    with pytest.raises(TypeError):
        Speculation(rt, np.array([0.5]))
    sp = Speculation(rt, np.array([seq.index]))
    with pytest.raises(ValueError, match="vocabulary"):
        sp.extend(np.array([EOS + 1]))
    assert sp.extend(np.array([4])).ok.tolist() == [True]
    with pytest.raises(ValueError, match="accepted 2"):
        sp.commit(np.array([2]))
    with pytest.raises(TypeError):
        sp.commit(np.array([1, 1]))
    sp.commit(np.array([0]))
    with pytest.raises(ValueError, match="committed"):
        sp.extend(np.array([4]))
    with pytest.raises(ValueError, match="committed"):
        sp.commit(np.array([0]))
    sp.close()   # idempotent after a commit
    assert seq.seen == [1]
    req.close()


def test_a_draft_outside_the_mask_before_it_ends_its_row_without_a_call(rt, scripted_wasm):
    ctrl = rt.load(scripted_wasm)
    req = rt.new_request(ctrl, script(result(branch(mask=[65, 66]))), NO_FORK)
    seq = req.spawn()
    out = rt.submit([StepInput(seq, [1])]).wait(timeout_s=30)
    m0 = out.masks[:1].copy()
    with Speculation(rt, np.array([seq.index])) as sp:
        n_ok, _, _ = sp.run(np.array([[65, 67, 65]]), first_masks=m0)
        assert n_ok.tolist() == [1] and sp.drafted == [[65]]
    assert len(parse_trace(req.variables["trace"])) == 1   # the drafts' calls left no trace
    req.close()


def test_the_draft_whose_result_ended_the_row_can_be_committed_with_that_result(rt, scripted_wasm):
    ctrl = rt.load(scripted_wasm)
    req = rt.new_request(ctrl, script(result(branch(mask=ALL_BYTES)), var_set("z", "1", result(branch(mask=ALL_BYTES))),
                                      log("bye", stop())), NO_FORK)
    seq = req.spawn()
    rt.submit([StepInput(seq, [1])]).wait(timeout_s=30)
    sp = Speculation(rt, np.array([seq.index]))
    n_ok, _, _ = sp.run(np.array([[7, 8, 9]]))
    r = sp.ended_result(0)
    assert n_ok.tolist() == [1] and r is not None and r.is_stop and sp.draft_logs(0) == ["", "bye"]
    assert "z" not in req.variables
    sp.commit(np.array([2]))
    assert seq.finished and seq.error is None and seq.seen == [1, 7, 8]
    assert req.variables["z"] == b"1" and seq.log.endswith(b"bye")
    req.close()
