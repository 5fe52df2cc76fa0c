"""Optional backend: a GGUF model through llama-cpp-python (`pip install aicirt[llamacpp]`).

Not exercised in CI: llama-cpp-python builds from source (about 6-15 minutes); `make test-slow`
builds it (`make setup-llamacpp`, with -DGGML_NATIVE=OFF: a native build dies with SIGILL on
some VMs) and runs tests/test_llamacpp.py. It is imported only when this backend is asked for
(`--model llamacpp:FILE.gguf`).

Design: one llama.cpp context holds one sequence at a time. Each cache is the sequence's token
list; a forward first rewinds the context to the longest prefix it shares with that list (which
`Llama.eval` trims from the KV cache) and evaluates the rest. The next-token logits are read from
the context itself (`llama_get_logits_ith(ctx, -1)`, the last evaluated token): with
`logits_all=False`, llama-cpp-python 0.3.x never fills `Llama.scores[n_tokens - 1]`, which
read as all zeros (every greedy step took the lowest allowed token). One sequence decodes at about
13 ms/token for SmolLM2-135M; forks and interleaved requests re-evaluate from their common
prefix when they take turns, so for many forks prefer the transformers backend.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from functools import cached_property
from typing import Any

import numpy as np

from ...errors import MissingExtraError
from . import model_files
from .base import Backend, KVCache, TokenId

LLAMACPP_INSTALL = "pip install 'aicirt[llamacpp]'"


class _LlamaTokenizer:
    """The runtime's tokenizer protocol over a `llama_cpp.Llama`."""

    def __init__(self, llm: Any, eos_token_id: int) -> None:
        self.llm = llm
        self.vocab_size = int(llm.n_vocab())
        self.eos_token_id = eos_token_id

    @cached_property
    def token_bytes(self) -> list[bytes]:
        return [self.llm.detokenize([i]) if i != self.eos_token_id else b"" for i in range(self.vocab_size)]

    def encode(self, text: str) -> list[TokenId]:
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def decode_bytes(self, ids: Sequence[TokenId]) -> bytes:
        tb = self.token_bytes
        return b"".join(tb[i] for i in ids if 0 <= i < self.vocab_size)


class LlamaCppBackend(Backend):
    """`model_path`: a GGUF file (None: the default SmolLM2 GGUF). Raises
    `aicirt.MissingExtraError` (an `ImportError`) without llama-cpp-python, `FileNotFoundError` without the model."""

    name = "llamacpp"

    def __init__(self, model_path: str | os.PathLike[str] | None = None, *, n_ctx: int = 4096,
                 threads: int | None = None, verbose: bool = False) -> None:
        try:
            from llama_cpp import Llama
        except ImportError as e:
            raise MissingExtraError("the llama.cpp backend needs llama-cpp-python", LLAMACPP_INSTALL, str(e)) from None
        path = model_path or model_files.default_gguf()
        self.llm = Llama(model_path=str(path), n_ctx=n_ctx, logits_all=False, verbose=verbose,
                         n_threads=threads or max(1, (os.cpu_count() or 2) - 1))
        self.vocab_size = int(self.llm.n_vocab())
        self.eos_token_id = int(self.llm.token_eos())
        self._tokenizer = _LlamaTokenizer(self.llm, self.eos_token_id)
        self._template = str(self.llm.metadata.get("tokenizer.chat_template", ""))
        self._uids = 0

    def runtime_tokenizer(self) -> _LlamaTokenizer:
        return self._tokenizer

    def encode(self, text: str) -> list[TokenId]:
        return self._tokenizer.encode(text)

    def decode_bytes(self, tokens: Sequence[TokenId]) -> bytes:
        return self._tokenizer.decode_bytes(tokens)

    def format_prompt(self, prompt: str, *, chat: bool = True) -> list[TokenId]:
        if chat and "<|im_start|>" in self._template:  # ChatML (SmolLM2, Qwen)
            text = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
            return list(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))
        return self.encode(prompt)

    def new_cache(self) -> KVCache:
        return KVCache(0, [])

    def forward(self, batch: Sequence[tuple[KVCache, Sequence[TokenId]]]) -> np.ndarray:
        self._check_batch(batch)
        out = np.empty((len(batch), self.vocab_size), dtype=np.float32)
        for i, (cache, tokens) in enumerate(batch):
            target = cache.state + [int(t) for t in tokens]
            current = list(self.llm.input_ids[: self.llm.n_tokens])
            common = 0
            for a, b in zip(current, target):
                if a != b:
                    break
                common += 1
            common = min(common, len(target) - 1)  # always evaluate at least the last token
            self.llm.n_tokens = common              # eval() trims the KV cache from n_tokens on
            self.llm.eval(target[common:])
            out[i] = self._last_logits()
            cache.state = target
            cache.length = len(target)
        return out

    def _last_logits(self) -> np.ndarray:
        """The logits after the last evaluated token (a view of llama.cpp's buffer: copy it)."""
        import llama_cpp
        ptr = llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        if not ptr:
            raise RuntimeError("llama.cpp returned no logits for the last token")
        return np.ctypeslib.as_array(ptr, shape=(self.vocab_size,))

    def backtrack(self, cache: KVCache, length: int) -> None:
        self._check_backtrack(cache, length)
        del cache.state[length:]
        cache.length = length

    def fork(self, cache: KVCache) -> KVCache:
        if cache.freed:
            raise ValueError("cache already freed")
        return KVCache(cache.length, list(cache.state))

    def close(self) -> None:
        llm = vars(self).pop("llm", None)   # closed: no model held (a second close finds none)
        if llm is not None and hasattr(llm, "close"):
            llm.close()
