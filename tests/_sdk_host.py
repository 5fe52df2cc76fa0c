"""A minimal host for SDK tests: runs one controller instance with wasmtime-py's public API.

Independent of aicirt.Runtime on purpose: the SDK's tests pin the canonical-ABI glue and the
mask semantics directly (and ran before the runtime existed). Slow per call (public API), fine
for tests; the benchmark goes through the runtime.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
import wasmtime

from aicirt.host.toktrie import serialize_trie

HOST = "aici:controller/host@0.1.0"
I32 = wasmtime.ValType.i32()
_ENGINE: wasmtime.Engine | None = None
_MODULES: dict[bytes, wasmtime.Module] = {}


def _module(wasm: bytes) -> wasmtime.Module:
    """One compile per controller binary for the whole test session (a compile took ~0.3 s of CPU
    per MiniHost, most of a json walk's cost); every MiniHost still gets its own store."""
    global _ENGINE
    if _ENGINE is None:
        _ENGINE = wasmtime.Engine()
    if wasm not in _MODULES:
        _MODULES[wasm] = wasmtime.Module(_ENGINE, wasm)
    return _MODULES[wasm]


@dataclass
class Branch:
    mask: np.ndarray | None          # uint32 words
    temperature: float | None
    splices: list[tuple[tuple[int, ...], int, list[int]]]

    def allowed(self) -> set[int]:
        bits = np.unpackbits(self.mask.view(np.uint8), bitorder="little")
        return set(np.nonzero(bits)[0].tolist())


@dataclass
class MiniHost:
    wasm: bytes
    token_bytes: list[bytes]
    eos: int
    encode: callable
    arg: bytes = b""
    caps: int = 15
    seq_id: int = 1
    variables: dict = field(default_factory=dict)
    logs: list = field(default_factory=list)
    run_init: bool = False           # run the module's aicirt_init (as a Runtime does, once per tokenizer)

    def __post_init__(self):
        module = _module(self.wasm)
        self.engine = _ENGINE
        self.store = wasmtime.Store(self.engine)
        self.trie = serialize_trie(self.token_bytes)
        linker = wasmtime.Linker(self.engine)
        for name, params, results, fn in self._imports():
            linker.define_func(HOST, name, wasmtime.FuncType([I32] * params, [I32] * results), fn)
        self.inst = linker.instantiate(self.store, module)
        ex = self.inst.exports(self.store)
        self.mem, self.realloc, self.mid = ex["memory"], ex["cabi_realloc"], ex["mid-process"]
        if "_initialize" in ex:
            ex["_initialize"](self.store)
        if self.run_init and "aicirt_init" in ex:
            ex["aicirt_init"](self.store)

    # -- memory helpers
    def read(self, ptr, n) -> bytes:
        return bytes(self.mem.read(self.store, ptr, ptr + n))

    def write(self, ptr, data: bytes):
        if data:
            self.mem.write(self.store, data, ptr)

    def alloc(self, data: bytes, align=4) -> int:
        p = self.realloc(self.store, 0, 0, align, len(data))
        self.write(p, data)
        return p

    def u32s(self, ptr, n) -> list[int]:
        return list(struct.unpack(f"<{n}I", self.read(ptr, 4 * n))) if n else []

    def _ret_list(self, ret, data: bytes, align=1):
        self.write(ret, struct.pack("<II", self.alloc(data, align), len(data) // (4 if align == 4 else 1)))

    def _imports(self):
        def s(ptr, n):
            return self.read(ptr, n).decode("utf-8", "replace")

        def tokenize(p, n, ret):
            ids = self.encode(s(p, n))
            self.write(ret, struct.pack("<II", self.alloc(struct.pack(f"<{len(ids)}I", *ids)), len(ids)))

        def detok(p, n, ret):
            self._ret_list(ret, b"".join(self.token_bytes[t] for t in self.u32s(p, n)))

        def var_get(p, n, ret):
            v = self.variables.get(s(p, n))
            if v is None:
                self.write(ret, bytes(12))
            else:
                self.write(ret, struct.pack("<III", 1, self.alloc(v, 1), len(v)))

        def var_set(np_, nl, vp, vl):
            self.variables[s(np_, nl)] = self.read(vp, vl)

        def var_append(np_, nl, vp, vl):
            k = s(np_, nl)
            self.variables[k] = self.variables.get(k, b"") + self.read(vp, vl)

        return [
            ("vocab-size", 0, 1, lambda: len(self.token_bytes)),
            ("eos-token", 0, 1, lambda: self.eos),
            ("token-trie", 1, 0, lambda ret: self._ret_list(ret, self.trie)),
            ("tokenize", 3, 0, tokenize),
            ("detokenize", 3, 0, detok),
            ("arg", 1, 0, lambda ret: self._ret_list(ret, self.arg)),
            ("self-seq-id", 0, 1, lambda: self.seq_id),
            ("capabilities", 0, 1, lambda: self.caps),
            ("var-get", 3, 0, var_get),
            ("var-set", 4, 0, var_set),
            ("var-append", 4, 0, var_append),
            ("log", 2, 0, lambda p, n: self.logs.append(s(p, n))),
        ]

    def step(self, tokens, backtrack=0, sampled=None, fork_group=()) -> list[Branch]:
        tp = self.alloc(struct.pack(f"<{len(tokens)}I", *tokens)) if tokens else 0
        gp = self.alloc(struct.pack(f"<{len(fork_group)}I", *fork_group)) if fork_group else 0
        r = self.mid(self.store, backtrack, tp, len(tokens), int(sampled is not None),
                     sampled or 0, gp, len(fork_group))
        bptr, n = struct.unpack("<II", self.read(r, 8))
        out = []
        n_words = (len(self.token_bytes) + 31) // 32
        for i in range(n):
            raw = self.read(bptr + 28 * i, 28)
            mtag, mptr, mlen, ttag, temp, sptr, slen = struct.unpack("<B3xIIB3xfII", raw)
            mask = None
            if mtag:
                assert mlen == n_words, (mlen, n_words)
                mask = np.frombuffer(self.read(mptr, 4 * mlen), dtype=np.uint32).copy()
            splices = []
            for j in range(slen):
                wp, wl, bt, fp, fl = struct.unpack("<5I", self.read(sptr + 20 * j, 20))
                splices.append((tuple(self.u32s(wp, wl)), bt, self.u32s(fp, fl)))
            out.append(Branch(mask, temp if ttag else None, splices))
        return out
