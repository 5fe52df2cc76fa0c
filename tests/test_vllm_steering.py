"""The vLLM adapter's core (aicirt.integrations.steering) on fake logits: no vLLM, no torch.

A `MaskOnlyHost` plays vLLM's part (one token appended per step, logits masked, greedy argmax).
The reference is aicirt's own engine on the same fake model: a controller that only masks,
fast-forwards (conditionally or not), no-ops and stops must see exactly the same calls (its
"trace" variable) and produce the same tokens under both hosts.
"""
from __future__ import annotations

import logging

import numpy as np
import pytest
import scripted as S

import aicirt
from aicirt.engine.backends.scripted import ScriptedBackend
from aicirt.engine import Engine, SamplingParams
from aicirt.integrations import steering as st

TOK = aicirt.ByteTokenizer()
EOS = TOK.eos_token_id
PROMPT = list(b"hi")


class MaskOnlyHost:
    """vLLM's side: per step, begin -> fake forward -> end -> mask -> argmax -> append one token."""

    def __init__(self, steering: st.Steering, backend: ScriptedBackend, max_tokens: int = 24):
        self.steering, self.backend, self.max_tokens = steering, backend, max_tokens
        self.live: list[tuple[st.Steered | None, list[int], list[int]]] = []   # (steered, prompt, output)
        self.done: list[tuple[st.Steered | None, list[int]]] = []

    def add(self, controller, arg: bytes, prompt=PROMPT) -> list[int]:
        output: list[int] = []
        s = None if controller is None else self.steering.open(controller, arg, prompt, output)
        self.live.append((s, list(prompt), output))
        return output

    def step(self) -> None:
        controlled = [s for s, _, _ in self.live if s is not None]
        self.steering.begin(controlled)
        logits = np.stack([self.backend.logits_for(tuple(p + o)) for _, p, o in self.live])
        plan = self.steering.end()
        k = 0
        for i, (s, _, output) in enumerate(self.live):
            row = logits[i]
            if s is not None:
                bits = np.unpackbits(plan.masks[k].view(np.uint8), bitorder="little")[:len(row)]
                row = np.where(bits == 1, row, -np.inf)
                k += 1
            output.append(int(np.argmax(row)))
        still = []
        for s, p, o in self.live:
            if o[-1] == EOS or len(o) >= self.max_tokens:
                self.done.append((s, o))
            else:
                still.append((s, p, o))
        self.live = still

    def run(self) -> None:
        for _ in range(self.max_tokens + 2):
            if not self.live:
                return
            self.step()
        raise AssertionError("host did not finish")


@pytest.fixture
def runtime():
    rt = aicirt.Runtime(TOK, cache_dir=False)
    yield rt
    rt.close()


@pytest.fixture
def ctrl(runtime, scripted_wasm):
    return runtime.load(scripted_wasm)


def backend() -> ScriptedBackend:
    return ScriptedBackend(TOK, script="the quick brown fox jumps over the lazy dog ")


def under_engine(runtime, ctrl, arg: bytes) -> tuple[list[int], list[dict], str | None]:
    engine = Engine(backend(), runtime)
    req = engine.generate(PROMPT, ctrl, arg, capabilities=st.MASK_ONLY_CAPABILITIES,
                          params=SamplingParams(temperature=0.0, max_tokens=24))
    seq = req.sequences[0]
    trace = S.parse_trace(req.variables.get("trace", b""))
    engine.close()
    return seq.output_tokens, trace, seq.error


def under_host(runtime, ctrl, arg: bytes) -> tuple[list[int], list[dict], st.Steered]:
    host = MaskOnlyHost(st.Steering(runtime, EOS), backend())
    out = host.add(ctrl, arg)
    host.run()
    (s, _), = host.done
    trace = S.parse_trace(s.request.variables.get("trace", b""))
    s.close()
    return out, trace, s


def strip_seq(trace: list[dict]) -> list[dict]:
    return [{k: v for k, v in call.items() if k != "seq"} for call in trace]


A, B, C = ord("a"), ord("b"), ord("c")
SAME_UNDER_BOTH = {
    "mask then stop": S.script(S.result(S.branch(mask=[A, B])), S.result(S.branch(mask=[C])), S.stop()),
    "unconditional ff": S.script(S.result(S.branch(splices=[S.splice(ff=list(b"XYZ"))])),
                                 S.result(S.branch(mask=[A])), S.stop()),
    "mask + unconditional splice": S.script(S.result(S.branch(mask=[A, B], splices=[S.splice(ff=list(b"QR"))])),
                                            S.result(S.branch(mask=[C])), S.stop()),
    "conditional splice taken": S.script(
        S.result(S.branch(mask=list(range(97, 123)), splices=[S.splice(ff=list(b"!!"), when=[ord("t")])])),
        S.result(S.branch(mask=[C])), S.stop()),
    "conditional splice not taken": S.script(
        S.result(S.branch(mask=list(range(97, 123)), splices=[S.splice(ff=list(b"!!"), when=[ord("z")])])),
        S.result(S.branch(mask=[C])), S.stop()),
    "no-op then mask": S.script(S.noop(), S.noop(), S.result(S.branch(mask=[B])), S.stop()),
    "temperature 0 branch": S.script(S.result(S.branch(mask=[A, B], temperature=0.0)), S.stop()),
}


@pytest.mark.parametrize("name", list(SAME_UNDER_BOTH))
def test_controller_sees_the_same_calls_as_under_the_engine(runtime, ctrl, name):
    arg = SAME_UNDER_BOTH[name]
    ref_tokens, ref_trace, ref_error = under_engine(runtime, ctrl, arg)
    assert ref_error is None
    tokens, trace, s = under_host(runtime, ctrl, arg)
    assert s.error is None and s.stopped
    assert strip_seq(trace) == strip_seq(ref_trace)
    assert tokens == ref_tokens + [EOS]   # the engine stops; vLLM is forced to EOS


def test_a_mixed_batch_gives_each_request_the_calls_it_gets_alone(runtime, ctrl):
    # All scripts in one batch: steps where every row is a mask (Steering's common-step path)
    # alternate with steps where some rows are held, forced, no-op or finished (the general path).
    refs = {name: under_engine(runtime, ctrl, arg) for name, arg in SAME_UNDER_BOTH.items()}
    host = MaskOnlyHost(st.Steering(runtime, EOS), backend())
    outputs = {name: host.add(ctrl, arg) for name, arg in SAME_UNDER_BOTH.items()}
    host.run()
    by_output = {id(o): s for s, o in host.done}
    for name, (ref_tokens, ref_trace, _) in refs.items():
        s = by_output[id(outputs[name])]
        assert s.error is None and s.stopped, name
        assert strip_seq(S.parse_trace(s.request.variables.get("trace", b""))) == strip_seq(ref_trace), name
        assert outputs[name] == ref_tokens + [EOS], name
        s.close()


def test_fast_forward_is_forced_one_token_a_step_while_the_controller_is_held(runtime, ctrl):
    arg = S.script(S.result(S.branch(splices=[S.splice(ff=list(b"WXYZ"))])), S.stop())
    tokens, trace, _ = under_host(runtime, ctrl, arg)
    assert bytes(tokens[:4]) == b"WXYZ" and tokens[4] == EOS
    assert len(trace) == 2                      # called once before, once after the four forced steps
    assert trace[1]["tokens"] == list(b"WXYZ") and trace[1]["sampled"] is None


def test_backtrack_is_a_capability_error_that_ends_only_its_request(runtime, ctrl, caplog):
    steering = st.Steering(runtime, EOS)
    host = MaskOnlyHost(steering, backend(), max_tokens=300)   # room for the error text
    bad = host.add(ctrl, S.script(S.result(S.branch(mask=[A], splices=[S.splice(backtrack=1, ff=[B])]))))
    good = host.add(ctrl, S.script(S.result(S.branch(mask=[A])), S.result(S.branch(mask=[B])), S.stop()))
    plain = host.add(None, b"")
    with caplog.at_level(logging.WARNING, logger="aicirt.integrations"):
        host.run()
    failed = next(s for s, o in host.done if o is bad)
    assert "capability `backtrack` was not granted" in failed.error
    text = bytes(t for t in bad if t < 256).decode()
    assert text.startswith("\n[aicirt error: ") and "backtrack" in text and bad[-1] == EOS
    assert "backtrack" in caplog.text
    assert good == [A, B, EOS]
    alone = MaskOnlyHost(st.Steering(runtime, EOS), backend(), max_tokens=300)
    expected = alone.add(None, b"")
    alone.run()
    assert plain == expected                    # the plain request in the same batch is untouched


def test_fork_is_not_granted(runtime, ctrl):
    arg = S.script(S.result(S.branch(mask=[A]), S.branch(mask=[B])))
    _, _, s = under_host(runtime, ctrl, arg)
    assert "capability `fork` was not granted" in s.error


def test_trap_and_endless_no_op_end_the_request(runtime, ctrl):
    _, _, s = under_host(runtime, ctrl, S.script(S.trap()))
    assert s.error and s.finished
    _, _, s = under_host(runtime, ctrl, S.script(S.noop()))
    assert f"no answer after {st.MAX_NOOPS + 1} rounds" in s.error


def test_late_controller_is_waited_for_not_skipped(scripted_wasm):
    # A soft deadline nothing can meet: the engine would no-op; this host waits (up to the hard limit).
    with aicirt.Runtime(TOK, limits=aicirt.Limits(soft_deadline_s=1e-9), cache_dir=False) as rt:
        ctrl = rt.load(scripted_wasm)
        arg = S.script(S.result(S.branch(mask=[A])), S.result(S.branch(mask=[B])), S.stop())
        tokens, trace, s = under_host(rt, ctrl, arg)
        assert s.error is None and tokens == [A, B, EOS] and len(trace) == 3


def test_past_the_hard_limit_is_an_error(scripted_wasm):
    with aicirt.Runtime(TOK, limits=aicirt.Limits(call_timeout_s=0.05, first_call_timeout_s=0.05),
                        cache_dir=False) as rt:
        _, _, s = under_host(rt, rt.load(scripted_wasm), S.script(S.loop_forever()))
        assert "time limit" in s.error and bytes(s.output).startswith(b"\n[aicirt error: trap")


def test_a_host_that_appends_two_tokens_fails_the_request(runtime, ctrl):
    steering = st.Steering(runtime, EOS)
    output: list[int] = []
    s = steering.open(ctrl, S.script(S.result(S.branch(mask=[A]))), PROMPT, output)
    steering.begin([s])
    steering.end()
    output += [A, A]
    steering.begin([s])
    plan = steering.end()
    assert "appended 2 tokens" in s.error
    assert plan.masks.shape == (1, runtime.mask_words)
    s.close()


def test_without_error_text_only_eos_is_forced(runtime, ctrl):
    host = MaskOnlyHost(st.Steering(runtime, EOS, error_text=False), backend())
    out = host.add(ctrl, S.script(S.trap()))
    host.run()
    assert out == [EOS]


def test_misuse_raises(runtime):
    steering = st.Steering(runtime, EOS)
    with pytest.raises(ValueError, match="without begin"):
        steering.end()
    with pytest.raises(ValueError, match="outside the vocabulary"):
        st.Steering(runtime, TOK.vocab_size)


def test_importing_aicirt_does_not_import_vllm_or_torch():
    import subprocess
    import sys
    code = ("import sys, aicirt, aicirt.integrations, aicirt.integrations.steering; "
            "print(any(m in sys.modules for m in ('vllm', 'torch')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_discarded_sample_is_planned_again_without_a_call(runtime, ctrl):
    # vLLM samples a chunked prefill's partial chunks and drops the token: nothing is appended.
    steering = st.Steering(runtime, EOS)
    output: list[int] = []
    arg = S.script(S.result(S.branch(mask=[A])), S.result(S.branch(splices=[S.splice(ff=[B, C])])),
                   S.stop())
    s = steering.open(ctrl, arg, PROMPT, output)
    plans = []
    for append in ([], [A], [], [B], [C], [EOS]):
        steering.begin([s])
        plans.append(st_allowed(steering.end().masks[0]))
        output += append
    assert plans == [[A], [A], [B], [B], [C], [EOS]]
    trace = S.parse_trace(s.request.variables["trace"])
    assert [c["tokens"] for c in trace] == [PROMPT, [A], [B, C]] and s.stopped
    s.close()


def st_allowed(row: np.ndarray) -> list[int]:
    return [int(t) for t in np.nonzero(np.unpackbits(row.view(np.uint8), bitorder="little"))[0]]


def test_a_controller_that_could_not_be_had_fails_with_its_message(runtime):
    steering = st.Steering(runtime, EOS)
    output: list[int] = []
    s = steering.open("controller 'x' failed to load: bad magic", "", PROMPT, output)
    assert s.error == "controller 'x' failed to load: bad magic"
    while not output or output[-1] != EOS:
        steering.begin([s])
        output.append(st_allowed(steering.end().masks[0])[0])
    assert bytes(output[:-1]).decode() == "\n[aicirt error: controller 'x' failed to load: bad magic]"
    s.close()
    with pytest.raises(ValueError, match="closed"):
        steering.begin([s])


def test_a_step_the_host_skipped_is_replayed(runtime, ctrl):
    # begin twice without end (vLLM ran no sampler that step): no call is lost or repeated.
    steering = st.Steering(runtime, EOS)
    output: list[int] = []
    s = steering.open(ctrl, S.script(S.result(S.branch(mask=[A])), S.result(S.branch(mask=[B])), S.stop()),
                      PROMPT, output)
    steering.begin([s])
    steering.begin([s])
    assert st_allowed(steering.end().masks[0]) == [A]
    output.append(A)
    steering.begin([s])
    assert st_allowed(steering.end().masks[0]) == [B]
    assert len(S.parse_trace(s.request.variables["trace"])) == 2
    s.close()


def test_a_first_call_trap_leads_with_the_controllers_own_reason(runtime, ctrl):
    host = MaskOnlyHost(st.Steering(runtime, EOS), backend(), max_tokens=300)   # room for the error text
    out = host.add(ctrl, S.script(S.log("bad pattern: unbalanced (", S.trap())))
    host.run()
    (s, _), = host.done
    assert s.error.startswith("bad pattern: unbalanced ( (") and "trap" in s.error, s.error
    text = bytes(t for t in out if t < 256).decode()
    assert text.startswith("\n[aicirt error: bad pattern: unbalanced ( ("), text


def test_a_controller_that_stops_at_once_saying_why_has_refused_its_argument(runtime, ctrl):
    _, _, s = under_host(runtime, ctrl, S.script(S.log("no such schema keyword: 'x'", S.stop())))
    assert s.error == "no such schema keyword: 'x' (it stopped on its first call)"
    _, _, quiet = under_host(runtime, ctrl, S.script(S.stop()))   # said nothing: a plain stop
    assert quiet.error is None and quiet.stopped and quiet.output == [EOS]
    _, _, later = under_host(runtime, ctrl, S.script(S.result(S.branch(mask=[A])), S.log("done", S.stop())))
    assert later.error is None and later.output == [A, EOS]


def test_variable_changes_are_left_to_the_embedder_unless_they_are_logged(runtime, ctrl, caplog):
    """The adapter takes a request's variable changes only to log them (at DEBUG): otherwise they
    stay for whoever reads them (`take_var_changes`), coalesced per name at no cost."""
    arg = S.script(S.var_set("k", "v1", S.result(S.branch(mask=[A]))),
                   S.var_set("k", "v2", S.result(S.branch(mask=[B]))), S.stop())
    _, _, s = under_host(runtime, ctrl, arg)
    assert {name: value for _, _, name, value in s.request.take_var_changes()}["k"] == b"v2"
    with caplog.at_level(logging.DEBUG, logger="aicirt.integrations"):
        _, _, logged = under_host(runtime, ctrl, arg)
    assert "var set k = b'v1'" in caplog.text and "var set k = b'v2'" in caplog.text
    assert not [c for c in logged.request.take_var_changes() if c[2] == "k"]
