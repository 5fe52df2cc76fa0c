"""`aicirt run`'s early check: the controller's first `mid-process` call on the model's tokenizer
alone, so that an argument the controller rejects is reported before the weights load.

Loading SmolLM2 takes seconds (and its first conversion about 20 s); the tokenizer alone loads in
a fraction of a second from the converted folder's `tokenizer.json`. The stand-in model is
`ScriptedBackend` over that tokenizer: the controller sees the real vocabulary, EOS token and
token trie, so anything it decides from its argument and the tokenizer (a regex that does not
parse, answers that tokenize alike) fails here exactly as it would in the real run.

The prompt it sees is the user's text tokenized without the model's chat template (applying the
template needs transformers, whose import alone costs seconds). Only a first call that ends in
error is reported; after any other outcome the real run starts its request from scratch, on the
same `Runtime` (so the check costs no second compile or token-trie build).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..engine.backends import ScriptedBackend
from ..engine import Engine, GenSeq, SamplingParams
from ..core.runtime import Runtime
from ..host.tokenizer import HFTokenizer, Tokenizer

if TYPE_CHECKING:
    import tokenizers


def model_tokenizer(model: str | os.PathLike | None) -> HFTokenizer | None:
    """The tokenizer `load_backend(model)` would give the runtime, without loading weights.

    None where that is not cheap or not the same tokenizer: the scripted and llama.cpp backends
    (the first loads in microseconds anyway), a GGUF not converted yet, a folder without
    `tokenizer.json`, or the `tokenizers` package missing.
    """
    from ..engine.backends import model_files

    spec = None if model is None else str(model)
    if spec is not None and spec.split(":", 1)[0] in ("scripted", "llamacpp"):
        return None
    try:
        import tokenizers
        kind, path, gguf_name = model_files.resolve(model)
        folder = path if kind == "hf" or gguf_name is None else model_files.converted_dir(path, gguf_name)
    except (ImportError, OSError):
        return None             # the real load reports it, with the install command
    if not (folder / "tokenizer.json").is_file():
        return None
    raw = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    return HFTokenizer(raw, eos_token_id=_eos_token_id(folder, raw))


def _eos_token_id(folder: Path, raw: tokenizers.Tokenizer) -> int | None:
    """EOS as transformers reads it for the backend: tokenizer_config's `eos_token`, else config's
    `eos_token_id` (the first of a list); None lets `HFTokenizer` pick it by name."""
    def load(name: str) -> dict:
        try:
            return json.loads((folder / name).read_text())
        except (OSError, ValueError):
            return {}

    token = load("tokenizer_config.json").get("eos_token")
    if isinstance(token, dict):
        token = token.get("content")
    found = raw.token_to_id(token) if isinstance(token, str) else None
    if found is not None:
        return int(found)
    eos = load("config.json").get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return int(eos) if isinstance(eos, int) else None


def first_call_error(runtime: Runtime, wasm: str | os.PathLike, arg: bytes, prompt: str) -> tuple[str, str] | None:
    """Run the controller's first call on `runtime` (over the model's tokenizer, see
    `model_tokenizer`); `(error, log)` if it ended in error, or stopped at once having logged
    why (how a controller may reject its argument), else None.

    The runtime can then serve the real run (`Engine(backend, runtime=...)`): the controller is
    compiled and the token trie built once. Raises `aicirt.LoadError` for a module the runtime
    does not accept.
    """
    backend = ScriptedBackend(runtime.tokenizer)
    tokens = backend.encode(prompt) or [int(runtime.tokenizer.eos_token_id)]   # a chat prompt is never empty
    with Engine(backend, runtime=runtime) as engine:
        req = engine.add_request(tokens, wasm, arg, params=SamplingParams(max_tokens=1))
        seq = req.sequences[0]
        engine.step()
        # a first call still running is pending (it never holds the step up): step until it is in;
        # the runtime's first-call time limit bounds this
        while seq.finish_reason is None and seq.ctrl is not None and seq.ctrl.call_out:
            engine.step()
        return first_call_failure(seq)


def first_call_failure(seq: GenSeq) -> tuple[str, str] | None:
    """`(error, log)` if `seq`, which has had only its first call, ended in error or stopped at
    once having logged why (how a controller rejects its argument); None otherwise. The one rule
    of a refused start: `aicirt run` applies it before the model loads, `aicirt serve` answers
    such a request with a 400. Word it with `aicirt.errors.failure_message(error, log)`."""
    logs = "".join(seq.logs)
    if seq.finish_reason == "error":
        return str(seq.error), logs
    if seq.finish_reason == "stop" and not seq.output_tokens and logs.strip():
        return "it stopped on its first call", logs   # rejected its argument, saying why in the log
    return None


def same_tokenizer(a: Tokenizer, b: Tokenizer) -> bool:
    """Whether a runtime made over `a` serves a backend whose runtime tokenizer is `b`.

    `model_tokenizer` reads the very `tokenizer.json` the backend reads, so only the EOS token
    (taken from different files) and the size could tell them apart."""
    return int(a.vocab_size) == int(b.vocab_size) and int(a.eos_token_id) == int(b.eos_token_id)
