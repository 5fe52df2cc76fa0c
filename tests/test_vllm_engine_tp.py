"""Tensor parallelism on the vLLM engine: TP 2 gives exactly TP 1's outputs, protocol included.

The model is a small random-weight Llama (4 layers, 4 heads, 2 KV heads, so both divide by 2)
with SmolLM2's tokenizer, made here from a seed; its text is noise, only determinism is checked.
Each TP size runs in a process of its own (this file as a script), on vLLM's CPU build with
`VLLM_CPU_OMP_THREADS_BIND="0|1"` at TP 2. The workload: seeded sampled requests with and without
a controller, beside a controller that hits its time limit, and the protocol (fork, splice,
backtrack into the prompt, conditional splice, wait on a variable).

    python tests/test_vllm_engine_tp.py MODEL_DIR TP OUT.json
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SEED = 1234


def make_model(folder: Path, seed: int = SEED) -> Path:
    """A random-weight Llama with SmolLM2's tokenizer, in `folder` (made once per folder)."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from aicirt.engine.backends.model_files import local_model_dir

    if (folder / "config.json").is_file():
        return folder
    src = Path(local_model_dir(None))
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=49152, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         bos_token_id=1, eos_token_id=2, tie_word_embeddings=True, torch_dtype="float32")
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():      # larger than the default init, so the logits are not flat
            p.normal_(0.0, 0.2)
    model.save_pretrained(folder, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (src / name).is_file():
            shutil.copy(src / name, folder / name)
    return folder


def workload(engine) -> dict:
    """Run the TP workload on `engine` (a VllmEngine); what a client sees, as JSON-able data."""
    sys.path.insert(0, str(HERE))
    import aicirt
    from aicirt.build import toolchain
    from aicirt.engine import SamplingParams
    from scripted import branch, by_fork_index, loop_forever, result, script, splice, stop, var_set, wait_var

    ctrl = engine.runtime.load(toolchain.build_cached(HERE / "controllers" / "scripted.c", sdk=False))
    prompt = [504, 3575, 282, 4649, 314]
    allowed = list(range(100, 140))
    reqs = {
        "plain_seeded": engine.add_request(prompt, None, params=SamplingParams(max_tokens=24, temperature=1.0, seed=5)),
        "masked_seeded": engine.add_request(prompt, ctrl, script(result(branch(mask=allowed))),
                                            params=SamplingParams(max_tokens=24, temperature=0.8, seed=6)),
        "runaway": engine.add_request(prompt, ctrl, script(result(branch(mask=allowed)), loop_forever()),
                                      params=SamplingParams(max_tokens=24, temperature=1.0, seed=7)),
        "protocol": engine.add_request(prompt, ctrl, script(
            result(branch(mask=allowed), branch(mask=allowed),
                   branch(splices=[splice(backtrack=3, ff=[70, 71, 72])])),
            by_fork_index(result(branch(mask=allowed, splices=[splice(when=allowed[:20], backtrack=1, ff=[9])])),
                          wait_var("go", result(branch(mask=allowed))),
                          var_set("go", "1", result(branch(mask=allowed)))),
            result(branch(mask=allowed)), stop()), params=SamplingParams(max_tokens=12, temperature=1.0, seed=8)),
        "greedy_ff": engine.add_request(prompt, ctrl, script(result(branch(splices=[splice(ff=list(range(1000, 1040)))])),
                                                             result(branch(mask=list(range(200, 1200))))),
                                        params=SamplingParams(max_tokens=50)),
    }
    for _ in engine.run():
        pass
    out = {}
    for name, req in reqs.items():
        # an error's text quotes the CPU time the call used ("used 0.21 s"): the measure, not the outcome
        out[name] = {"sequences": [[s.label, s.parent, s.tokens, s.finish_reason, re.sub(r"[0-9.]+", "#", s.error or "")[:40]]
                                   for s in req.sequences],
                     "variables": {k: v.decode("latin-1") for k, v in req.variables.items() if k != "trace"}}
    out["_limits"] = str(aicirt.Limits().call_timeout_s)
    return out


def main(model: str, tp: int, out: str) -> None:
    import aicirt
    from aicirt.engine.vllm_engine import VllmEngine

    engine = VllmEngine(model, tensor_parallel_size=tp, dtype="float32", max_model_len=512, seed=0,
                        limits=aicirt.Limits(soft_deadline_s=5.0, call_timeout_s=0.2))
    try:
        Path(out).write_text(json.dumps(workload(engine)))
    finally:
        engine.close()


@pytest.mark.vllm
def test_tp2_gives_tp1s_outputs_with_the_whole_protocol(tmp_path_factory):
    pytest.importorskip("vllm")
    model = make_model(tmp_path_factory.mktemp("tiny-llama"))
    outs = []
    for tp in (1, 2):
        path = tmp_path_factory.mktemp(f"tp{tp}") / "out.json"
        env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
        if tp == 2:
            env["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"
        proc = subprocess.run([sys.executable, __file__, str(model), str(tp), str(path)], env=env,
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outs.append(json.loads(path.read_text()))
    tp1, tp2 = outs
    assert tp2 == tp1
    # the workload did what it says, so the comparison covers it
    assert tp1["runaway"]["sequences"][0][3] == "error"
    assert len(tp1["protocol"]["sequences"]) == 3 and tp1["protocol"]["variables"] == {"go": "1"}
    assert tp1["greedy_ff"]["sequences"][0][2][5:45] == list(range(1000, 1040))
    assert len(set(tp1["plain_seeded"]["sequences"][0][2][5:])) > 5     # sampled, not stuck


if __name__ == "__main__":   # vLLM's TP workers spawn and import the main module again
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
