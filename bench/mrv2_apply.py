"""The MRV2 processor's cost a logits row on CPU: `apply_staged_writes()` + `apply(logits, ctx)`
(controllers started, waited for, masks written; with drafts, the speculation calls too) against
writing the same masks alone (`torch_masks.mask_rows`), at batch 1, 8 and 64, with no drafts and
with 4 drafts a request (5 rows a request; every draft accepted, so every draft row costs a
controller call).

Synthetic MRV2 state as in tests/test_vllm_mrv2.py (vLLM's own interface types, CPU tensors),
the model's tokenizer (SmolLM2, 49,152 tokens), controller `regex` over `[a-z ]*`.

    .venv/bin/python bench/mrv2_apply.py [--steps 30] [--out bench/results/mrv2_apply.txt]

Prints a table (median and p10-p90 over steps) and, last, one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from types import SimpleNamespace

import numpy as np
import torch
from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsContext, LogitsProcRequestState

from aicirt.engine.backends.model_files import local_model_dir
from aicirt.integrations import vllm as v1
from aicirt.integrations.torch_masks import MaskBiases, mask_rows
from vllm import SamplingParams

MAX_LEN = 4096


class _Host:
    """A UvaBackedTensor's shape: the numpy source of truth and its tensor."""

    def __init__(self, n):
        self.cpu = torch.zeros(n, dtype=torch.int32)
        self.np = self.cpu.numpy()
        self.gpu = self.cpu


class _Device:
    """A StagedWriteTensor's shape: a device tensor, read back with .cpu()."""

    def __init__(self, *shape, device="cpu"):
        self.gpu = torch.zeros(*shape, dtype=torch.int32, device=device)


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return f.read().strip()


def run(batch: int, k: int, steps: int, folder: str) -> dict:
    slots = batch
    state = LogitsProcRequestState(device=torch.device("cpu"), max_num_reqs=slots, vocab_size=0,
                                   all_token_ids=_Device(slots, MAX_LEN), prompt_len=_Host(slots),
                                   prefill_len=_Host(slots), total_len=_Device(slots))
    cfg = SimpleNamespace(model_config=SimpleNamespace(tokenizer=folder, tokenizer_revision=None, trust_remote_code=False))
    proc = v1.AicirtLogitsProcessor(cfg, state)
    tok = proc._tokenizer
    letter = tok.encode("a")[-1]
    prompt = tok.encode("Write letters: ")
    vocab = int(tok.vocab_size)
    for s in range(slots):
        state.all_token_ids.gpu[s, :len(prompt)] = torch.tensor(prompt, dtype=torch.int32)
        state.total_len.gpu[s] = len(prompt)
        state.prompt_len.np[s] = state.prefill_len.np[s] = len(prompt)
        proc.add_request(s, SamplingParams(temperature=0.0, max_tokens=MAX_LEN - 64,
                                           extra_args={"aicirt_controller": "regex", "aicirt_arg": "[a-z ]*"}))
    rows_per = k + 1
    n_rows = slots * rows_per
    ctx = LogitsContext(expanded_idx_mapping=torch.arange(slots).repeat_interleave(rows_per),
                        idx_mapping=torch.arange(slots), idx_mapping_np=np.arange(slots, dtype=np.int32),
                        expanded_local_pos=torch.arange(rows_per).repeat(slots),
                        input_ids=torch.full((n_rows,), letter, dtype=torch.int64),
                        pos=torch.zeros(n_rows, dtype=torch.int64), seq_lens_upper_bound_np=np.zeros(slots, np.int32))
    base = torch.randn(n_rows, vocab)
    ours, alone, cpu_ours = [], [], []
    biases = MaskBiases()
    for step in range(steps + 3):
        logits = base.clone()
        c0, t0 = time.process_time(), time.perf_counter()
        proc.apply_staged_writes()
        proc.apply(logits, ctx)
        t1, c1 = time.perf_counter(), time.process_time()
        rows, masks = proc.applied   # the same masks written alone
        logits2 = base.clone()
        t2 = time.perf_counter()
        mask_rows(logits2, rows, masks, biases)
        t3 = time.perf_counter()
        if step >= 3:
            ours.append((t1 - t0) * 1e6 / n_rows)
            cpu_ours.append((c1 - c0) * 1e6 / n_rows)
            alone.append((t3 - t2) * 1e6 / n_rows)
        # the host appends: every draft accepted, then one more letter
        for s in range(slots):
            n = int(state.total_len.gpu[s])
            state.all_token_ids.gpu[s, n:n + rows_per] = letter
            state.total_len.gpu[s] = n + rows_per
    proc.runtime.close()

    def spread(xs):
        q = np.percentile(xs, [10, 50, 90])
        return {"p50": round(float(q[1]), 2), "p10": round(float(q[0]), 2), "p90": round(float(q[2]), 2)}
    return {"batch": batch, "drafts": k, "rows": n_rows, "apply_us_per_row": spread(ours),
            "apply_cpu_us_per_row": spread(cpu_ours), "masks_alone_us_per_row": spread(alone),
            "ratio": round(statistics.median(ours) / statistics.median(alone), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    folder = str(local_model_dir(None))
    lines = [f"# bench/mrv2_apply.py --steps {a.steps}  (torch {torch.__version__}, {os.cpu_count()} CPUs)",
             f"# load before: {loadavg()}"]
    results = []
    for k in (0, 4):
        for batch in (1, 8, 64):
            r = run(batch, k, a.steps, folder)
            results.append(r)
            lines.append(f"batch {batch:3d} drafts {k}: apply {r['apply_us_per_row']['p50']:8.1f} µs/row "
                         f"(p10 {r['apply_us_per_row']['p10']:.1f}, p90 {r['apply_us_per_row']['p90']:.1f}; "
                         f"CPU {r['apply_cpu_us_per_row']['p50']:.1f})   masks alone "
                         f"{r['masks_alone_us_per_row']['p50']:7.1f} µs/row   ratio {r['ratio']:.1f}x")
            print(lines[-1], flush=True)
    lines.append(f"# load after: {loadavg()}")
    lines.append(json.dumps({"bench": "mrv2_apply", "vocab": 49152, "controller": "regex", "steps": a.steps,
                             "results": results}))
    text = "\n".join(lines) + "\n"
    print(lines[-2])
    print(lines[-1])
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    sys.exit(main())
