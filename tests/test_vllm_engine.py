"""The whole protocol on vLLM (`aicirt.engine.vllm_engine`): one conformance suite of
forced-output controllers run on the own engine and on the vLLM engine, with identical
observable results. `make test-vllm`.

The controller is tests/controllers/scripted.c (a script of results given as its argument; it
appends what each call received to the variable "trace"). Every mask allows one token, so the
output does not depend on the model: the own engine runs them on the scripted backend over
SmolLM2's tokenizer, the vLLM engine on SmolLM2 itself. Every case runs at once, in one batch, on
each engine (one vLLM engine for the module: loading takes ~30 s on two cores).
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

import aicirt  # noqa: E402
from aicirt import Capabilities  # noqa: E402
from aicirt.engine import Engine, FinishEvent, ForkEvent, SamplingParams, TokensEvent  # noqa: E402
from aicirt.engine.backends import ScriptedBackend  # noqa: E402
from scripted import (branch, by_fork_index, noop, parse_trace, result, script, splice, stop,  # noqa: E402
                      trap, var_set, wait_var)

PROMPT = [504, 3575, 282, 4649, 314]          # "The capital of France is" in SmolLM2's vocabulary
FF60 = list(range(1000, 1060))                # token ids far past a byte tokenizer's 257
NO_FORK = Capabilities.ALL & ~Capabilities.FORK


def _cases(eos: int) -> dict[str, tuple]:
    """name -> (script steps, params, capabilities, prompt)."""
    p = SamplingParams
    return {
        "mask_then_stop": ([result(branch(mask=[65])), result(branch(mask=[1059])), stop()], p(max_tokens=8)),
        "splice_after_sample_into_prompt": (
            [result(branch(mask=[65], splices=[splice(backtrack=2, ff=[90, 91])])), stop()], p(max_tokens=8)),
        "conditional_first_match": (
            [result(branch(mask=[5], splices=[splice(when=[5], backtrack=1, ff=[50, 51]),
                                              splice(when=[6, 5], ff=[60])])), stop()], p(max_tokens=8)),
        "conditional_second_match": (
            [result(branch(mask=[6], splices=[splice(when=[5], backtrack=1, ff=[50, 51]),
                                              splice(when=[6, 5], ff=[60])])), stop()], p(max_tokens=8)),
        "conditional_no_match": (
            [result(branch(mask=[7], splices=[splice(when=[5], ff=[50])])), stop()], p(max_tokens=8)),
        "long_fast_forward": (
            [result(branch(mask=[65])), result(branch(splices=[splice(ff=FF60)])), result(branch(mask=[66])), stop()],
            p(max_tokens=80)),
        "pure_backtrack_then_mask": (
            [result(branch(splices=[splice(backtrack=2)])), result(branch(mask=[65])), stop()], p(max_tokens=8)),
        "backtrack_into_prompt_with_ff": ([result(branch(splices=[splice(backtrack=4, ff=[70])])), stop()],
                                          p(max_tokens=8)),
        "backtrack_past_start": ([result(branch(splices=[splice(backtrack=6)]))], p(max_tokens=8)),
        "noops_then_mask": ([noop(), noop(), result(branch(mask=[65])), stop()], p(max_tokens=8)),
        "endless_noop": ([noop()], p(max_tokens=8, max_idle_steps=5)),
        "fork_three": (
            [result(branch(mask=[65]), branch(mask=[66]), branch(splices=[splice(backtrack=1, ff=[67, 68])])),
             by_fork_index(result(branch(mask=[41])), result(branch(mask=[42])), result(branch(mask=[43]))), stop()],
            p(max_tokens=8)),
        "fork_wait_on_variable": (
            [result(branch(mask=[31]), branch(mask=[32])),
             by_fork_index(wait_var("answer", var_set("seen", "yes", stop())), result(branch(mask=[33]))),
             by_fork_index(stop(), var_set("answer", "42", stop()))], p(max_tokens=8)),
        "fork_child_traps": (
            [result(branch(mask=[31]), branch(mask=[32])), by_fork_index(trap(), result(branch(mask=[33])))],
            p(max_tokens=4)),
        "trap_after_a_token": ([result(branch(mask=[65])), trap()], p(max_tokens=5)),
        "fork_refused": ([result(branch(mask=[1]), branch(mask=[2]))], p(max_tokens=4), NO_FORK),
        "eos": ([result(branch(mask=[65])), result(branch(mask=[eos]))], p(max_tokens=8)),
        "eos_taken_back": ([result(branch(mask=[eos], splices=[splice(when=[eos], backtrack=1, ff=[9])])), stop()],
                           p(max_tokens=8)),
        "max_tokens": ([result(branch(mask=[65]))], p(max_tokens=3)),
        "ff_counts_to_max_tokens": ([result(branch(splices=[splice(ff=[11, 12])]))], p(max_tokens=3)),
        "stop_string": ([result(branch(splices=[splice(ff=[1059, 1060, 33])])), result(branch(mask=[65]))],
                        p(max_tokens=8, stop=(" dep",))),
        "logprobs": ([result(branch(mask=[65])), result(branch(splices=[splice(ff=[9, 10])])), result(branch(mask=[66]))],
                     p(max_tokens=5, logprobs=2)),
        "temperature_branch": ([result(branch(mask=[65], temperature=2.0)), result(branch(mask=[66])), stop()],
                               p(max_tokens=8, seed=3)),
    }


def _run(engine, ctrl, cases: dict) -> dict:
    reqs = {}
    for name, case in cases.items():
        steps, params = case[0], case[1]
        caps = case[2] if len(case) > 2 else Capabilities.ALL
        reqs[name] = engine.add_request(list(PROMPT), ctrl, script(*steps), capabilities=caps, params=params)
    events = []
    for _ in range(400):
        if not engine.has_unfinished:
            break
        events += engine.step()
    assert not engine.has_unfinished, "engine did not finish"
    return {name: _observed(req, [e for e in events if e.request is req]) for name, req in reqs.items()}


def _observed(req, events) -> dict:
    """What a client can see of a request, with seq ids as labels."""
    label = {s.seq_id: s.label for s in req.sequences}
    traces: dict[int, list] = {}
    for t in parse_trace(req.variables.get("trace", b"")):
        edit = (t["backtrack"], t["tokens"], t["sampled"], [label.get(x) for x in t["fork_group"]])
        seq = traces.setdefault(label.get(t["seq"]), [])
        if not (edit == (0, [], None, []) and seq and seq[-1] == edit):   # how many steps a wait takes
            seq.append(edit)                                              # is a race on either engine
    return {
        "sequences": [(s.label, s.parent, s.tokens, s.finish_reason, s.error, s.text, s.logprobs)
                      for s in req.sequences],
        "variables": {k: v for k, v in req.variables.items() if k != "trace"},
        "traces": traces,
        "forks": [(e.parent.label, e.child.label) for e in events if isinstance(e, ForkEvent)],
        "finishes": sorted((e.seq.label, e.reason) for e in events if isinstance(e, FinishEvent)),
        "stream": {s.label: _stream(s, events) for s in req.sequences},
    }


def _stream(seq, events) -> list:
    """The sequence's text edits as streamed (TokensEvents), net of waits."""
    return [(e.backtrack, e.tokens) for e in events if isinstance(e, TokensEvent) and e.seq is seq]


@pytest.fixture(scope="module")
def vllm_engine():
    from aicirt.engine.vllm_engine import VllmEngine

    engine = VllmEngine(max_model_len=1024, limits=aicirt.Limits(soft_deadline_s=5.0))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def both(vllm_engine, scripted_wasm_module):
    tok = vllm_engine.backend.runtime_tokenizer()
    cases = _cases(vllm_engine.backend.eos_token_id)
    rt = aicirt.Runtime(tok, limits=aicirt.Limits(soft_deadline_s=5.0), cache_dir=False)
    try:
        own = _run(Engine(ScriptedBackend(tok), rt), rt.load(scripted_wasm_module), cases)
    finally:
        rt.close()
    passes0 = vllm_engine.passes
    on_vllm = _run(vllm_engine, vllm_engine.runtime.load(scripted_wasm_module), cases)
    return own, on_vllm, vllm_engine.passes - passes0


@pytest.fixture(scope="module")
def scripted_wasm_module():
    from pathlib import Path

    from aicirt.build import toolchain

    return toolchain.build_cached(Path(__file__).parent / "controllers" / "scripted.c", sdk=False)


@pytest.mark.parametrize("case", list(_cases(0)))
def test_same_observable_results_on_both_engines(both, case):
    own, on_vllm, _ = both
    assert on_vllm[case] == own[case]


def test_the_suite_checks_what_it_claims(both):
    """The cases did what their names say (on the own engine, and so on vLLM)."""
    own, on_vllm, _ = both
    seqs = {k: v["sequences"] for k, v in on_vllm.items()}
    assert seqs["long_fast_forward"][0][2] == PROMPT + [65] + FF60 + [66]
    assert seqs["backtrack_into_prompt_with_ff"][0][2] == [PROMPT[0], 70]
    assert seqs["backtrack_past_start"][0][3] == "error" and "past the start" in seqs["backtrack_past_start"][0][4]
    assert [s[2][len(PROMPT) - 1:] for s in seqs["fork_three"]] == [[314, 65, 41], [314, 66, 42], [67, 68, 43]]
    assert on_vllm["fork_wait_on_variable"]["variables"] == {"answer": b"42", "seen": b"yes"}
    assert [s[3] for s in seqs["fork_child_traps"]] == ["error", "length"]
    assert seqs["fork_refused"][0][3] == "error" and "fork" in seqs["fork_refused"][0][4]
    assert seqs["eos"][0][3] == "eos" and seqs["eos_taken_back"][0][2] == PROMPT + [9]
    assert seqs["endless_noop"][0][3] == "error" and "no-op" in seqs["endless_noop"][0][4]
    assert seqs["stop_string"][0][3] == "stop"
    assert seqs["logprobs"][0][6] == [(0.0, ((65, 0.0),)), (0.0, ((9, 0.0),)), (0.0, ((10, 0.0),)), (0.0, ((66, 0.0),)),
                                      (0.0, ((66, 0.0),))]   # one allowed token: probability 1


def test_bad_input_is_refused_and_harms_nothing(vllm_engine):
    with pytest.raises(ValueError, match="out of range"):
        vllm_engine.add_request([1, 10 ** 6], None)
    with pytest.raises(ValueError, match="no tokens"):
        vllm_engine.add_request([], None)
    with pytest.raises(ValueError, match="context"):
        vllm_engine.add_request([5] * 2000, None)
    with pytest.raises(aicirt.LoadError):
        vllm_engine.add_request(PROMPT, b"\0asm not really")
    req = vllm_engine.generate(PROMPT, None, params=SamplingParams(max_tokens=4))
    assert req.sequences[0].finish_reason == "length" and len(req.sequences[0].output_tokens) == 4


def test_abort_ends_only_that_request(vllm_engine, scripted_wasm_module):
    ctrl = vllm_engine.runtime.load(scripted_wasm_module)
    a = vllm_engine.add_request(PROMPT, ctrl, script(result(branch(mask=[65]))), params=SamplingParams(max_tokens=30))
    b = vllm_engine.add_request(PROMPT, ctrl, script(result(branch(mask=[66]))), params=SamplingParams(max_tokens=6))
    vllm_engine.step()
    vllm_engine.step()
    vllm_engine.abort(a)
    for _ in vllm_engine.run():
        pass
    assert a.sequences[0].finish_reason == "abort" and len(a.sequences[0].output_tokens) < 30
    assert b.sequences[0].finish_reason == "length" and b.sequences[0].output_tokens == [66] * 6
    assert vllm_engine.core.scheduler.get_num_unfinished_requests() == 0   # vLLM holds no request either
