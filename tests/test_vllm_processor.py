"""AicirtLogitsProcessor's batch bookkeeping, driven directly with vLLM's BatchUpdate (no engine).

Rows are added, moved, swapped, removed and preempted as vLLM's persistent batch does it; fake
logits stand in for the model. Needs vLLM installed (make test-vllm), but no model load.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality  # noqa: E402

from aicirt.engine.backends.model_files import local_model_dir  # noqa: E402
from aicirt.integrations.vllm import AicirtLogitsProcessor, request_controller  # noqa: E402


@pytest.fixture(scope="module")
def proc():
    cfg = SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=False),
                          model_config=SimpleNamespace(tokenizer=str(local_model_dir(None)), tokenizer_revision=None,
                                                       trust_remote_code=False))
    p = AicirtLogitsProcessor(cfg, torch.device("cpu"), False)
    yield p
    p.runtime.close()


def countdown(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=64, temperature=0.0, extra_args={"aicirt_controller": "countdown", "aicirt_arg": str(n)})


def step(proc, outputs: dict[int, list[int]], update=None, plain_rows=()) -> dict[int, int]:
    """One engine step: update_state, fake logits, apply, greedy pick, append to each row's output.
    Rows in `plain_rows` must come out of `apply` untouched."""
    proc.update_state(update)
    n = max(outputs) + 1
    logits = torch.randn(n, proc.runtime.vocab_size, generator=torch.Generator().manual_seed(len(outputs)))
    before = logits.clone()
    proc.apply(logits)
    for r in plain_rows:
        assert torch.equal(logits[r], before[r])
    picked = {}
    for row, out in outputs.items():
        picked[row] = int(torch.argmax(logits[row]))
        out.append(picked[row])
    return picked


def text(proc, tokens) -> str:
    return proc.runtime.tokenizer.decode_bytes(tokens).decode()


def test_rows_follow_moves_swaps_and_preemption(proc):
    eos = proc.steering.eos_token_id
    a, b, plain = countdown(3), countdown(2), SamplingParams(max_tokens=64)
    out_a, out_b, out_p = [], [], []
    prompt = proc.runtime.tokenizer.encode("Count:")
    add = [(0, a, prompt, out_a), (1, plain, prompt, out_p), (2, b, prompt, out_b)]
    rows = {0: out_a, 1: out_p, 2: out_b}
    step(proc, rows, BatchUpdate(3, [], add, []), plain_rows=[1])
    step(proc, rows, plain_rows=[1])
    # a and b swap places; the plain row moves from 1 to 3
    step(proc, {0: out_b, 1: out_p, 2: out_a}, BatchUpdate(3, [], [], [(0, 2, MoveDirectionality.SWAP)]),
         plain_rows=[1])
    rows = {0: out_b, 2: out_a, 3: out_p}
    step(proc, rows, BatchUpdate(4, [], [], [(1, 3, MoveDirectionality.UNIDIRECTIONAL)]), plain_rows=[1, 3])
    # b is preempted (removed unfinished), then comes back at another row with the same params
    step(proc, {2: out_a, 3: out_p}, BatchUpdate(4, [0], [], []), plain_rows=[0, 3])
    step(proc, {1: out_b, 2: out_a, 3: out_p}, BatchUpdate(4, [], [(1, b, prompt, out_b)], []), plain_rows=[3])
    for _ in range(12):
        live = {r: o for r, o in {1: out_b, 2: out_a}.items() if not o or o[-1] != eos}
        if not live:
            break
        step(proc, {**live, 3: out_p}, plain_rows=[3])
    assert text(proc, out_a[:-1]) == " 3 2 1 liftoff!" and out_a[-1] == eos
    assert text(proc, out_b[:-1]) == " 2 1 liftoff!" and out_b[-1] == eos
    proc.update_state(BatchUpdate(4, [3, 2, 1], [], []))
    assert not proc._rows and not proc._parked   # finished requests are freed, not parked


def test_logit_columns_past_the_vocabulary_are_masked(proc):
    out = []
    prompt = proc.runtime.tokenizer.encode("Count:")
    proc.update_state(BatchUpdate(1, [], [(0, countdown(1), prompt, out)], []))
    logits = torch.zeros(1, proc.runtime.vocab_size + 64)
    logits[0, -1] = 100.0                         # a padded column the model likes best
    proc.apply(logits)
    assert int(torch.argmax(logits[0])) < proc.runtime.vocab_size
    assert torch.isinf(logits[0, proc.runtime.vocab_size:]).all()
    proc.update_state(BatchUpdate(1, [0], [], []))


def test_request_keys_are_checked():
    assert request_controller(SamplingParams()) is None
    assert request_controller(SamplingParams(extra_args={"aicirt_controller": "regex", "aicirt_arg": 7})) == ("regex", "7")
    with pytest.raises(ValueError, match="unknown aicirt key"):
        request_controller(SamplingParams(extra_args={"aicirt_controler": "regex"}))
    with pytest.raises(ValueError, match="without aicirt_controller"):
        request_controller(SamplingParams(extra_args={"aicirt_arg": "x"}))
    with pytest.raises(ValueError, match="non-empty string"):
        request_controller(SamplingParams(extra_args={"aicirt_controller": 3}))


def test_async_scheduling_is_refused():
    cfg = SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=True), model_config=None)
    with pytest.raises(ValueError, match="no-async-scheduling"):
        AicirtLogitsProcessor(cfg, torch.device("cpu"), False)


def test_masks_hold_in_float32_logits(proc):
    # vLLM hands the processor float32 logits (the sampler converts before processors run).
    out = []
    p = SamplingParams(max_tokens=8, extra_args={"aicirt_controller": "regex", "aicirt_arg": "[0-9]+"})
    proc.update_state(BatchUpdate(1, [], [(0, p, proc.runtime.tokenizer.encode("Number:"), out)], []))
    logits = torch.randn(1, proc.runtime.vocab_size, dtype=torch.float32)
    proc.apply(logits)
    allowed = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    assert allowed and all(text(proc, [t]).isdigit() for t in allowed)
    assert np.isfinite(logits.numpy()).sum() == len(allowed)
    proc.update_state(BatchUpdate(1, [0], [], []))


def test_tags_module_ids_and_the_path_switch(proc, tmp_path, monkeypatch):
    from aicirt import toolchain
    from aicirt.integrations.vllm import resolve_reference
    from aicirt.serve.store import Store

    monkeypatch.setenv("AICIRT_STORE", str(tmp_path / "store"))
    wasm = toolchain.build_cached(toolchain.CONTROLLERS_DIR / "countdown")
    up = Store(tmp_path / "store").put(wasm.read_bytes(), tags=["launch"])
    module_id = up.module_id
    eos = proc.steering.eos_token_id
    prompt = proc.runtime.tokenizer.encode("Count:")
    for ref in ("launch", module_id):
        out: list[int] = []
        p = SamplingParams(max_tokens=32, extra_args={"aicirt_controller": ref, "aicirt_arg": "2"})
        AicirtLogitsProcessor.validate_params(p)
        proc.update_state(BatchUpdate(1, [], [(0, p, prompt, out)], []))
        for _ in range(12):
            logits = torch.zeros(1, proc.runtime.vocab_size)
            proc.apply(logits)
            out.append(int(torch.argmax(logits[0])))
            if out[-1] == eos:
                break
            proc.update_state(None)
        assert text(proc, out[:-1]) == " 2 1 liftoff!", ref
        proc.update_state(BatchUpdate(1, [0], [], []))
    monkeypatch.setenv("AICIRT_VLLM_ALLOW_PATHS", "0")
    with pytest.raises(ValueError, match="is not a tag, a module id or a shipped controller"):
        resolve_reference(str(wasm))
    assert resolve_reference("launch").name == f"{module_id}.wasm"
