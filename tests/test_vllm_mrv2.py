"""The Model Runner V2 processor (aicirt.integrations.vllm_mrv2) against vLLM's own interface
module, with synthetic `LogitsProcRequestState` / `LogitsContext` on CPU torch.

`Runner` plays MRV2's part: persistent slots recycled through `add_request` (no removal hook),
`apply_staged_writes` before the forward, `apply(logits, ctx)` after it, greedy sampling, and
under speculative decoding one logits row per draft with vLLM's acceptance rule (a draft is
kept while the token sampled at the row before it equals it; then the token sampled at the
first row not accepted). The fake model is the scripted backend (logits a function of the token
list), over the byte tokenizer. The reference for every run with drafts is the same requests
without drafts: greedy output must be identical.
"""
from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")
from vllm import SamplingParams  # noqa: E402
from vllm.v1.worker.gpu.sample.logits_processor.interface import (  # noqa: E402
    LogitsContext,
    LogitsProcRequestState,
)

import aicirt  # noqa: E402
from aicirt.engine.backends.scripted import ScriptedBackend  # noqa: E402
from aicirt.integrations import vllm as v1  # noqa: E402
from aicirt.integrations.vllm_mrv2 import AicirtMRV2LogitsProcessor  # noqa: E402

TOK = aicirt.ByteTokenizer()
EOS = TOK.eos_token_id
V = TOK.vocab_size
SLOTS, MAX_LEN = 8, 512


class _Host:
    """A UvaBackedTensor's shape: the numpy source of truth and its tensor."""

    def __init__(self, n: int) -> None:
        self.cpu = torch.zeros(n, dtype=torch.int32)
        self.np = self.cpu.numpy()
        self.gpu = self.cpu


class _Device:
    """A StagedWriteTensor's shape: a device tensor (here CPU), read back with .cpu()."""

    def __init__(self, *shape: int) -> None:
        self.gpu = torch.zeros(*shape, dtype=torch.int32)


@pytest.fixture
def proc(monkeypatch):
    monkeypatch.setattr(v1, "model_tokenizer", lambda *a, **k: TOK)
    state = LogitsProcRequestState(device=torch.device("cpu"), max_num_reqs=SLOTS, vocab_size=V,
                                   all_token_ids=_Device(SLOTS, MAX_LEN), prompt_len=_Host(SLOTS),
                                   prefill_len=_Host(SLOTS), total_len=_Device(SLOTS))
    config = SimpleNamespace(model_config=SimpleNamespace(tokenizer="unused", tokenizer_revision=None,
                                                          trust_remote_code=False))
    p = v1.AicirtLogitsProcessor(config, state)   # the V1 name builds the MRV2 processor under MRV2
    assert type(p) is AicirtMRV2LogitsProcessor
    yield p
    if p.started:
        p.runtime.close()


def params(ref=None, arg="", max_tokens=40) -> SamplingParams:
    extra = {} if ref is None else {"aicirt_controller": ref, "aicirt_arg": arg}
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, extra_args=extra)


class Runner:
    def __init__(self, proc: AicirtMRV2LogitsProcessor, backend: ScriptedBackend, drafter=None) -> None:
        self.proc, self.backend, self.drafter = proc, backend, drafter
        self.rs = proc.req_states
        self.live: dict[int, SamplingParams] = {}
        self.accepted = self.drafted = 0

    def tokens(self, slot: int) -> list[int]:
        return self.rs.all_token_ids.gpu[slot, :int(self.rs.total_len.gpu[slot])].tolist()

    def add(self, slot: int, p: SamplingParams, prompt: list[int], output=()) -> None:
        toks = [*prompt, *output]
        self.rs.all_token_ids.gpu[slot, :len(toks)] = torch.tensor(toks, dtype=torch.int32)
        self.rs.total_len.gpu[slot] = len(toks)
        self.rs.prompt_len.np[slot] = len(prompt)
        self.rs.prefill_len.np[slot] = len(toks)
        self.proc.add_request(slot, p)
        self.live[slot] = p

    def remove(self, slot: int) -> None:   # MRV2 has no removal hook: the slot is only freed
        del self.live[slot]

    def step(self) -> None:
        self.proc.apply_staged_writes()
        slots = sorted(self.live)
        row_slot, local, inputs, rows_logits, drafts = [], [], [], [], {}
        for slot in slots:
            toks = self.tokens(slot)
            d = self.drafter(toks) if self.drafter else []
            drafts[slot] = d
            prefix = list(toks)
            for j in range(len(d) + 1):
                row_slot.append(slot)
                local.append(j)
                inputs.append(prefix[-1])
                rows_logits.append(self.backend.logits_for(tuple(prefix)))
                if j < len(d):
                    prefix.append(d[j])
        logits = torch.tensor(np.stack(rows_logits), dtype=torch.float32)
        ctx = LogitsContext(expanded_idx_mapping=torch.tensor(row_slot), idx_mapping=torch.tensor(slots),
                            idx_mapping_np=np.array(slots, dtype=np.int32),
                            expanded_local_pos=torch.tensor(local), input_ids=torch.tensor(inputs),
                            pos=torch.zeros(len(row_slot), dtype=torch.int64),
                            seq_lens_upper_bound_np=np.zeros(len(slots), dtype=np.int32))
        out = self.proc.apply(logits, ctx)
        sampled = torch.argmax(out, dim=-1).tolist()
        r = 0
        for slot in slots:
            d = drafts[slot]
            a = 0
            while a < len(d) and sampled[r + a] == d[a]:
                a += 1
            new = [*d[:a], sampled[r + a]]
            self.accepted += a
            self.drafted += len(d)
            r += len(d) + 1
            n = int(self.rs.total_len.gpu[slot])
            p = self.live[slot]
            out_len = n - int(self.rs.prompt_len.np[slot])
            if EOS in new:
                new = new[:new.index(EOS) + 1]
            new = new[:p.max_tokens - out_len]
            self.rs.all_token_ids.gpu[slot, n:n + len(new)] = torch.tensor(new, dtype=torch.int32)
            self.rs.total_len.gpu[slot] = n + len(new)
            if new[-1] == EOS or out_len + len(new) >= p.max_tokens:
                self.remove(slot)

    def run(self, steps=200) -> None:
        for _ in range(steps):
            if not self.live:
                return
            self.step()

    def output(self, slot: int) -> list[int]:
        return self.tokens(slot)[int(self.rs.prompt_len.np[slot]):]


def prompt_lookup(k=4, n=2):
    """vLLM's n-gram drafter in small: the tokens that followed the last `n` tokens where they
    occurred before."""
    def draft(toks):
        tail = toks[-n:]
        for i in range(len(toks) - n - 1, -1, -1):
            if toks[i:i + n] == tail:
                return toks[i + n:i + n + k]
        return []
    return draft


def corrupted(drafter, seed=0):
    rng = np.random.default_rng(seed)

    def draft(toks):
        d = list(drafter(toks))
        return [int(rng.integers(0, 256)) if rng.random() < 0.2 else t for t in d]
    return draft


PROMPT = list(b"Copy: ab12cd34 ab12cd34 ab12cd34; ")


def _run(proc, requests, drafter=None, script=None):  # requests: {slot: (params, prompt)}
    backend = ScriptedBackend(script=script or PROMPT + list(b"ab12cd34 ab12cd34 zz"))
    runner = Runner(proc, backend, drafter)
    for slot, (p, prompt) in requests.items():
        runner.add(slot, p, prompt)
    runner.run()
    return runner, {slot: runner.output(slot) for slot in requests}


CASES = [("regex", "[a-d0-9 ]{4,30}"), ("regex", "ab12(cd34)?( ab12cd34)*"), ("json", '{"type":"object"}'),
         ("countdown", "3"), ("yesno", "")]


@pytest.mark.parametrize("ref,arg", CASES)
def test_draft_rows_give_the_same_greedy_output_as_no_drafts(proc, ref, arg):
    _, plain = _run(proc, {1: (params(ref, arg), PROMPT), 3: (params(), PROMPT)})
    for drafter in (prompt_lookup(), corrupted(prompt_lookup())):
        runner, spec = _run(proc, {1: (params(ref, arg), PROMPT), 3: (params(), PROMPT)}, drafter)
        assert spec == plain
        assert runner.drafted > 0
    assert plain[3] != plain[1] or ref == "regex"   # the uncontrolled slot is left alone


def test_the_masks_hold_and_drafts_are_accepted(proc):
    runner, out = _run(proc, {0: (params("regex", "(ab12cd34 ){2}"), PROMPT)}, prompt_lookup())
    assert bytes(out[0][:-1]) == b"ab12cd34 ab12cd34 " and out[0][-1] == EOS
    assert runner.accepted >= 8, (runner.accepted, runner.drafted)


def test_slots_are_recycled_through_add_request(proc):
    backend = ScriptedBackend(script=PROMPT + list(b"ab12cd34 zz"))
    runner = Runner(proc, backend)
    runner.add(2, params("regex", "ab12"), PROMPT)
    runner.run()
    assert runner.output(2) == [*b"ab12", EOS]
    first = proc._slots[2].steered
    runner.add(2, params("regex", "[0-9]{3}"), PROMPT)   # a new occupant: the old one is released
    assert first.request is None or first._closed
    runner.run()
    out = runner.output(2)
    assert bytes(out[:3]).isdigit() and out[3] == EOS


def test_a_preempted_request_resumes_with_its_controller(proc):
    p = params("regex", "[a-z0-9]{12}")
    _, plain = _run(proc, {0: (p, PROMPT)})
    backend = ScriptedBackend(script=PROMPT + list(b"ab12cd34 ab12cd34 zz"))
    runner = Runner(proc, backend)
    p2 = params("regex", "[a-z0-9]{12}")
    runner.add(0, p2, PROMPT)
    for _ in range(5):
        runner.step()
    partial = runner.output(0)
    steered = proc._slots[0].steered
    runner.remove(0)                       # preempted: the slot goes to another request
    runner.add(0, params(), list(b"other"))
    runner.step()
    runner.remove(0)
    runner.add(5, p2, PROMPT, partial)     # back, in another slot, prefill_len > prompt_len
    assert proc._slots[5].steered is None
    runner.run()
    assert proc._slots[5].steered is steered
    assert runner.output(5) == plain[0]


def test_warm_up_with_dummy_params_starts_nothing(proc):
    assert proc.add_request(0, SamplingParams()) is False
    proc.apply_staged_writes()
    logits = torch.randn(2, V)
    before = logits.clone()
    ctx = LogitsContext(expanded_idx_mapping=torch.tensor([0, 1]), idx_mapping=torch.tensor([0, 1]),
                        idx_mapping_np=np.array([0, 1]), expanded_local_pos=torch.zeros(2, dtype=torch.int64),
                        input_ids=torch.zeros(2, dtype=torch.int64), pos=torch.zeros(2, dtype=torch.int64),
                        seq_lens_upper_bound_np=np.zeros(2, dtype=np.int32))
    assert torch.equal(proc.apply(logits, ctx), before)
    assert not proc.started


def test_a_controller_error_ends_only_its_request(proc):
    _, out = _run(proc, {0: (params("regex", "("), PROMPT), 1: (params("regex", "ab"), PROMPT)}, prompt_lookup())
    assert b"aicirt error" in bytes(t for t in out[0] if t < 256)
    assert out[1][:2] == list(b"ab")


def test_validate_params_and_the_import_are_light():
    code = ("import sys; import aicirt.integrations.vllm_mrv2 as m; "
            "print('aicirt.integrations.vllm' in sys.modules, 'vllm.v1.sample.logits_processor' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
    with pytest.raises(ValueError, match="aicirt_controller"):
        AicirtMRV2LogitsProcessor.validate_params(SamplingParams(extra_args={"aicirt_controller": 3}))
    AicirtMRV2LogitsProcessor.validate_params(SamplingParams())


def test_a_held_request_accepts_drafts_that_follow_its_forced_tokens(proc, monkeypatch):
    # countdown fast-forwards " 3 2 1 liftoff!": a host that masks one token a step forces them one
    # a row; drafts copied from the prompt follow them, so several forced tokens go in one step
    prompt = list(b"Count: 3 2 1 liftoff! Again: ")
    forced_rows = []
    take = AicirtMRV2LogitsProcessor._take_drafts

    def spy(self, slot, new):   # countdown only forces: every accepted draft was a forced token
        forced_rows.append(len(new) - 1)
        return take(self, slot, new)
    monkeypatch.setattr(AicirtMRV2LogitsProcessor, "_take_drafts", spy)
    script = prompt + list(b" 3 2 1 liftoff! zz")
    _, plain = _run(proc, {0: (params("countdown", "3"), prompt)}, script=script)
    runner, spec = _run(proc, {0: (params("countdown", "3"), prompt)}, prompt_lookup(k=4, n=2), script=script)
    assert spec == plain and bytes(plain[0][:-1]) == b" 3 2 1 liftoff!"
    assert max(forced_rows, default=0) >= 2, forced_rows
