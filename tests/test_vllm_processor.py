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


def config():
    return SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=False),
                           model_config=SimpleNamespace(tokenizer=str(local_model_dir(None)), tokenizer_revision=None,
                                                        trust_remote_code=False))


@pytest.fixture(scope="module")
def proc():
    p = AicirtLogitsProcessor(config(), torch.device("cpu"), False)
    yield p
    if p.started:
        p.runtime.close()


def aicirt_threads() -> list[str]:
    import threading
    return [t.name for t in threading.enumerate() if t.name.startswith("aicirt")]


def test_an_idle_plugin_starts_nothing_and_leaves_logits_alone():
    before_threads = aicirt_threads()
    p = AicirtLogitsProcessor(config(), torch.device("cpu"), False)
    outputs = {0: [], 1: []}
    add = [(i, SamplingParams(max_tokens=8), [1, 2, 3], out) for i, out in outputs.items()]
    for k in range(4):
        p.update_state(BatchUpdate(2, [], add, []) if k == 0 else None)
        logits = torch.randn(2, 64)
        before = logits.clone()
        assert p.apply(logits) is logits and torch.equal(logits, before)
        for out in outputs.values():
            out.append(5)
    p.update_state(BatchUpdate(2, [0], [], [(1, 0, MoveDirectionality.UNIDIRECTIONAL)]))
    assert not p.started and aicirt_threads() == before_threads   # no runtime, no epoch ticker
    out: list[int] = []
    p.update_state(BatchUpdate(2, [], [(1, countdown(1), [1, 2, 3], out)], []))
    assert p.started                                               # the first controlled request
    p.update_state(BatchUpdate(2, [1], [], []))
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


def test_async_scheduling_starts_the_calls_in_apply():
    # With async scheduling vLLM's output list ends with a placeholder (-1) at update_state and
    # gets the real token just before apply: the calls then start in apply, with the same masks.
    cfg = config()
    cfg.scheduler_config.async_scheduling = True
    p = AicirtLogitsProcessor(cfg, torch.device("cpu"), False)
    tok = p._tokenizer
    digits = [t for t in range(p.runtime.vocab_size) if tok.decode_bytes([t]).isdigit()][:3]
    out: list[int] = []
    params = SamplingParams(max_tokens=8, extra_args={"aicirt_controller": "regex", "aicirt_arg": "[0-9]{3}"})
    p.update_state(BatchUpdate(1, [], [(0, params, tok.encode("Number:"), out)], []))
    for k in range(3):
        if k:
            out.append(-1)          # the placeholder at update_state
            p.update_state(None)
            assert p._deferred
            out[-1] = digits[k - 1]   # vLLM writes the token in before apply
        logits = torch.zeros(1, p.runtime.vocab_size)
        p.apply(logits)
        allowed = torch.isfinite(logits[0]).nonzero().flatten().tolist()
        assert digits[0] in allowed and all(tok.decode_bytes([t]).isdigit() for t in allowed)
    s = p._batch[0]
    assert s.tokens[-2:] == digits[:2] and s.error is None
    p.runtime.close()


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
    from aicirt.build import toolchain
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
    monkeypatch.setenv("AICIRT_VLLM_ALLOW_PATHS", "1")
    assert resolve_reference(str(wasm)) == wasm


def test_files_on_the_server_are_off_unless_the_operator_opts_in(monkeypatch, tmp_path):
    from aicirt.integrations.vllm import resolve_reference

    monkeypatch.delenv("AICIRT_VLLM_ALLOW_PATHS", raising=False)
    there, missing = tmp_path / "there.c", tmp_path / "missing.c"
    there.write_text("int x;\n")
    said = []
    for ref in (str(there), str(missing)):     # the same answer whether the file exists or not
        with pytest.raises(ValueError) as e:
            AicirtLogitsProcessor.validate_params(SamplingParams(extra_args={"aicirt_controller": ref}))
        said.append(str(e.value).replace(ref, "REF"))
    assert said[0] == said[1] and "is not a tag, a module id or a shipped controller" in said[0]
    monkeypatch.setenv("AICIRT_VLLM_ALLOW_PATHS", "yes")
    with pytest.raises(ValueError, match="AICIRT_VLLM_ALLOW_PATHS must be 0 or 1"):
        resolve_reference("regex")


def test_a_build_error_never_quotes_the_servers_file_to_the_client(monkeypatch, tmp_path, caplog):
    import logging

    monkeypatch.setenv("AICIRT_VLLM_ALLOW_PATHS", "1")
    secret = tmp_path / "secret.c"
    secret.write_text('const char *password = "hunter2-database-password";\nthis is not C;\n')
    params = SamplingParams(extra_args={"aicirt_controller": str(secret)})
    with caplog.at_level(logging.WARNING, logger="aicirt.integrations"), pytest.raises(ValueError) as e:
        AicirtLogitsProcessor.validate_params(params)
    assert "does not build" in str(e.value) and "server's log" in str(e.value)
    assert "hunter2" not in str(e.value) and "this is not C" not in str(e.value)
    assert "this is not C" in caplog.text or "secret.c" in caplog.text   # the operator sees it
