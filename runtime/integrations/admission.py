"""A controller's first call at admission, for a host that admits requests before it has their
prompt or the model's tokenizer at hand (vLLM's `validate_params` gets only the SamplingParams,
in the frontend process, before the prompt is tokenized).

The call runs as `aicirt run`'s early check does where the model's tokenizer is not at hand
(`aicirt.arg_check.first_call_error` over the byte tokenizer, empty prompt): what a controller
decides from its argument alone (a regex that does not parse, a schema it does not support)
fails here exactly as it would in the request. Only a first call that ends in error, or that
stops at once having logged why, is reported; anything that depends on the real vocabulary or
the prompt is left to the request itself (which then ends with the message in its output).

The runtime (and its threads) starts with the first check; answers are kept per (module file,
argument), up to MAX_REMEMBERED. Thread-safe: checks run one at a time.
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from ..errors import failure_message

#: (module file, argument) answers kept, least recently used out first.
MAX_REMEMBERED = 1024


class FirstCallCheck:
    """`refusal(wasm, arg)`: why the controller refuses `arg` on its first call, or None."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runtime: Any = None
        self._seen: OrderedDict[tuple, str | None] = OrderedDict()

    def refusal(self, wasm: str | os.PathLike, arg: bytes | str) -> str | None:
        """The controller's own reason first, then the Wasm detail (`failure_message`), when its
        first call on the stand-in (byte tokenizer, empty prompt) ends in error or stops at once
        saying why; None otherwise. Raises `aicirt.LoadError` for a module the runtime refuses."""
        from ..arg_check import first_call_error

        raw = arg.encode("utf-8") if isinstance(arg, str) else bytes(arg)
        st = Path(wasm).stat()
        key = (str(wasm), st.st_mtime_ns, st.st_size, raw)
        with self._lock:
            if key in self._seen:
                self._seen.move_to_end(key)
                return self._seen[key]
            failed = first_call_error(self._started(), wasm, raw, "")
            why = None if failed is None else failure_message(*failed)
            self._seen[key] = why
            while len(self._seen) > MAX_REMEMBERED:
                self._seen.popitem(last=False)
            return why

    def _started(self) -> Any:
        if self._runtime is None:
            from ..runtime import Runtime
            from ..tokenizer import ByteTokenizer

            self._runtime = Runtime(ByteTokenizer(), workers=1, prebuild_trie=False)
        return self._runtime

    def close(self) -> None:
        """Stop the runtime (if it started). Idempotent."""
        with self._lock:
            if self._runtime is not None:
                self._runtime.close()
                self._runtime = None
