"""A controller's first call at admission, for a host that admits requests before it has their
prompt or the model's tokenizer at hand (vLLM's `validate_params` gets only the SamplingParams,
in the frontend process, before the prompt is tokenized).

The call runs as `aicirt run`'s early check does (`aicirt.runner.arg_check.first_call_error`, empty
prompt) over the model's own tokenizer where the check knows the model (`FirstCallCheck(model)`,
`use_model`, or the `AICIRT_VLLM_MODEL` variable; `vllm_offline.default_llm` sets it), else over
the byte tokenizer as a stand-in: what a controller decides from its argument alone (a regex that
does not parse, a schema it does not support) fails there exactly as it would in the request.
Only a first call that ends in error, or that stops at once having logged why, is reported. On
the stand-in, a failure that depends on its 257-token vocabulary (a token id or a mask past it, a mask left empty without the tokens past it)
is not: the real model may accept it, and admission must never refuse what the engine would
accept; the request itself reports it if the model refuses it too.

The runtime (and its threads) starts with the first check; answers are kept per (module file,
argument), up to MAX_REMEMBERED. Thread-safe: checks run one at a time.
"""
from __future__ import annotations

import os
import re
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from ..errors import failure_message

#: (module file, argument) answers kept, least recently used out first.
MAX_REMEMBERED = 1024

#: The environment variable naming the model whose vocabulary first calls are judged against.
MODEL_ENV = "AICIRT_VLLM_MODEL"

#: Failures on the byte stand-in that come from its vocabulary, not the controller's argument.
_STAND_IN_VOCAB = re.compile(r">= vocab size \d+|mask has \d+ words, expected|mask allows no token")


class FirstCallCheck:
    """`refusal(wasm, arg)`: why the controller refuses `arg` on its first call, or None.

    `model`: the model (as `aicirt run --model` takes it) whose tokenizer first calls run on; None:
    the one `use_model` or `AICIRT_VLLM_MODEL` names when the first check runs, else the stand-in."""

    def __init__(self, model: str | os.PathLike | None = None) -> None:
        self._lock = threading.Lock()
        self._runtime: Any = None
        self._model = None if model is None else str(model)
        self.stand_in = True                 # whether checks run on the byte stand-in
        self._seen: OrderedDict[tuple, str | None] = OrderedDict()

    def use_model(self, model: str | os.PathLike | None) -> None:
        """Judge first calls against `model`'s tokenizer from now on (None: the default model)."""
        with self._lock:
            self._model = "" if model is None else str(model)
            self._close_runtime()
            self._seen.clear()

    def refusal(self, wasm: str | os.PathLike, arg: bytes | str) -> str | None:
        """The controller's own reason first, then the Wasm detail (`failure_message`), when its
        first call on the stand-in (byte tokenizer, empty prompt) ends in error or stops at once
        saying why; None otherwise. Raises `aicirt.LoadError` for a module the runtime refuses."""
        from ..runner.arg_check import first_call_error

        raw = arg.encode("utf-8") if isinstance(arg, str) else bytes(arg)
        st = Path(wasm).stat()
        key = (str(wasm), st.st_mtime_ns, st.st_size, raw)
        with self._lock:
            if key in self._seen:
                self._seen.move_to_end(key)
                return self._seen[key]
            failed = first_call_error(self._started(), wasm, raw, "")
            if failed is not None and self.stand_in and _STAND_IN_VOCAB.search(failed[0]):
                failed = None       # the stand-in's vocabulary, not the argument: the model may accept it
            why = None if failed is None else failure_message(*failed)
            self._seen[key] = why
            while len(self._seen) > MAX_REMEMBERED:
                self._seen.popitem(last=False)
            return why

    def _started(self) -> Any:
        if self._runtime is None:
            from ..runner.arg_check import model_tokenizer
            from ..core.runtime import Runtime
            from ..host.tokenizer import ByteTokenizer

            model = self._model if self._model is not None else os.environ.get(MODEL_ENV)
            tokenizer = model_tokenizer(model or None) if model is not None else None
            self.stand_in = tokenizer is None
            self._runtime = Runtime(tokenizer or ByteTokenizer(), workers=1, prebuild_trie=False)
        return self._runtime

    def _close_runtime(self) -> None:
        if self._runtime is not None:
            self._runtime.close()
            self._runtime = None

    def close(self) -> None:
        """Stop the runtime (if it started). Idempotent."""
        with self._lock:
            self._close_runtime()
