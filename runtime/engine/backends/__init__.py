"""Model backends for `aicirt.engine`: one small interface (`Backend`), several implementations.

- `TransformersBackend` (default): a Hugging Face causal LM on CPU; SmolLM2-135M-Instruct unless
  told otherwise. Imports torch, so it is loaded only when asked for.
- `ScriptedBackend`: a deterministic fake model for tests; no torch.
- `LlamaCppBackend`: llama-cpp-python, an optional extra (`pip install aicirt[llamacpp]`).
"""
from __future__ import annotations

import os
from typing import Any

from ...errors import MissingExtraError
from .base import Backend, KVCache
from .scripted import ScriptedBackend

__all__ = ["Backend", "KVCache", "ScriptedBackend", "load_backend"]


def load_backend(model: str | os.PathLike[str] | None = None, **options: Any) -> Backend:
    """Open a backend from a model argument, as `aicirt run --model` takes it.

    - None or "smollm2": SmolLM2-135M-Instruct through transformers (converted once, cached);
    - "scripted" or "scripted:SEED": the fake model over a byte-level tokenizer;
    - "llamacpp:PATH.gguf": llama.cpp (needs llama-cpp-python);
    - a `.gguf` file or a Hugging Face model folder: transformers.

    `options` go to the backend's constructor (e.g. `dtype`, `threads`). Raises
    `FileNotFoundError` for a model that cannot be found, `aicirt.MissingExtraError` (an
    `ImportError` whose one-line message names the `pip install` to run) for a missing extra.
    """
    spec = None if model is None else str(model)
    if spec is not None and (spec == "scripted" or spec.startswith("scripted:")):
        seed = int(spec.partition(":")[2] or 0)
        return ScriptedBackend(seed=seed, **options)
    if spec is not None and spec.startswith("llamacpp:"):
        from .llamacpp_backend import LlamaCppBackend

        return LlamaCppBackend(spec.partition(":")[2] or None, **options)
    from . import model_files

    model_files.resolve(model)  # a missing model is reported before torch is imported
    try:
        from .transformers_backend import TransformersBackend
    except ImportError as e:
        raise MissingExtraError("the transformers backend needs torch and transformers", model_files.MODEL_INSTALL,
                                str(e)) from None
    return TransformersBackend(model, **options)
