"""Prompt-lookup speculative decoding in the own engine, every draft row masked by its controller.

    engine = SpeculativeEngine(backend, drafter=PromptLookup(k=4))

A step for a greedy sequence (temperature 0, no stop strings, no logprobs) that the drafter
finds drafts for (the tokens that followed the last n-gram's latest earlier occurrence in the
prompt and output; no draft model):

    controller call for the current position (as every step)  | forward of the new tokens plus
                                                              | the k drafts: k + 1 logits rows
    verify, depth by depth: t_j = argmax(logits_j & mask_j); while t_j == d_j the draft is
    accepted and the controller's mask after it comes from the runtime's speculation call
    (`aicirt.core.speculate`: a copy-fork a draft, nothing committed); the first t_j that differs is
    the step's own token. The controller is committed to its state after the accepted drafts;
    the cache is cut back to them.

So a draft costs one controller call only while it is being accepted (the first mismatch ends
the speculation without one), and greedy output is token for token what `Engine` gives: each
accepted draft is the argmax under the controller's mask after the drafts before it, exactly as
plain stepping would have sampled it, and the step's own token is sampled by the engine's usual
apply (`apply.py`) under the mask after the accepted drafts. A controller result that is not a
plain mask ends the speculation at that draft: where the draft is the greedy token it is accepted
and this step applies that result (a fast-forward, a stop, an error, a mask with conditional
splices), exactly as the plain step after it would; a fork or a late call leaves the draft
unaccepted, and the next step's plain call makes that result again.

Every other sequence (sampling at T > 0, stop strings, logprobs, a fork in flight, no drafts)
takes the ordinary step in the same batch.
"""
from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, Callable, cast

import numpy as np

from ..abi import RowKind
from .engine import Engine
from .types import Event, GenSeq, TokensEvent

if TYPE_CHECKING:
    from ..core.batch import RowsOutcome
    from .backends.base import Backend, KVCache
    from .backends.scripted import ScriptedBackend
    from .backends.transformers_backend import TransformersBackend

_MASK, _OTHER = int(RowKind.MASK), int(RowKind.OTHER)


class PromptLookup:
    """N-gram drafts from the sequence's own tokens: the `k` tokens that followed the latest
    earlier occurrence of its last `n` tokens, trying n = `max_ngram` down to `min_ngram`."""

    def __init__(self, k: int = 4, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if k < 1 or not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"PromptLookup needs k >= 1 and 1 <= min_ngram <= max_ngram, got {k}, {min_ngram}, {max_ngram}")
        self.k, self.max_ngram, self.min_ngram = k, max_ngram, min_ngram

    def __call__(self, tokens: list[int], k: int | None = None) -> list[int]:
        k = self.k if k is None else k
        arr = np.asarray(tokens, dtype=np.int64)
        n_tok = len(arr)
        for n in range(min(self.max_ngram, n_tok - 1), self.min_ngram - 1, -1):
            tail = arr[n_tok - n:]
            # windows ending before the last token: the latest match has something after it
            win = np.lib.stride_tricks.sliding_window_view(arr[:n_tok - 1], n)
            hits = np.flatnonzero((win == tail).all(axis=1))
            if len(hits):
                start = int(hits[-1]) + n
                return [int(t) for t in arr[start:start + k]]
        return []


def forward_positions(backend: "Backend", cache: "KVCache", tokens: list[int], n_last: int) -> np.ndarray:
    """Forward `tokens` onto `cache` and return the logits after each of the last `n_last` of
    them, float32 [n_last, V]. The transformers and scripted backends do it in one forward; any
    other backend token by token (correct, slower)."""
    fn = getattr(backend, "forward_positions", None)
    if fn is not None:
        return fn(cache, tokens, n_last)
    name = type(backend).__name__
    if name == "TransformersBackend":       # by name: no torch import for the other backends
        import torch
        tb = cast("TransformersBackend", backend)
        tb._check_batch([(cache, tokens)])
        with torch.inference_mode():
            out = tb.model(input_ids=torch.tensor([list(tokens)], dtype=torch.long), use_cache=True,
                           logits_to_keep=n_last, **{tb._cache_kw: cache.state})
        cache.length += len(tokens)
        return out.logits[0, -n_last:].float().numpy()
    sb = cast("ScriptedBackend", backend) if name == "ScriptedBackend" else None
    if sb is not None and not sb.forward_delay_s:
        sb._check_batch([(cache, tokens)])
        held = cache.state["tokens"]
        held.extend(int(t) for t in tokens)
        cache.length = len(held)
        sb.calls.append([(cache.state["uid"], tuple(int(t) for t in tokens))])
        return np.stack([sb.logits_for(tuple(held[:len(held) - n_last + 1 + j])) for j in range(n_last)])
    head, last = tokens[:len(tokens) - n_last + 1], tokens[len(tokens) - n_last + 1:]
    rows = [backend.forward([(cache, head)])[0]]
    for t in last:
        rows.append(backend.forward([(cache, [t])])[0])
    return np.stack(rows)


def _masked_argmax(logits: np.ndarray, mask: np.ndarray | None, mask_vocab: int) -> int:
    if mask is None:
        return int(np.argmax(logits))
    width = min(len(logits), mask_vocab)
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[:width].astype(bool)
    return int(np.argmax(np.where(bits, logits[:width], -np.inf)))


class SpeculativeEngine(Engine):
    """`Engine` with prompt-lookup speculative decoding for its greedy sequences (see the module
    docstring); `drafter(tokens) -> drafts` (default `PromptLookup()`). `spec_stats` counts
    drafted and accepted tokens and the speculation's controller time."""

    def __init__(self, backend: "Backend", runtime: Any = None, *, drafter: Callable[[list[int]], list[int]] | None = None,
                 **kw: Any) -> None:
        super().__init__(backend, runtime, **kw)
        self.drafter = drafter or PromptLookup()
        self.spec_stats = {"steps": 0, "drafted": 0, "accepted": 0, "draft_rows": 0, "draft_us": 0.0}

    def _eligible(self, s: GenSeq) -> list[int]:
        p = s.request.params
        if p.temperature != 0 or p.stop or p.logprobs is not None or s.logits is not None:
            return []
        if s.ctrl is not None and (s.ctrl.call_out or any(x.call_out for x in s.ctrl.request.sequences)):
            return []
        room = p.max_tokens - s.generated - 1   # the step's own token comes on top
        if room < 1:
            return []
        drafts = self.drafter(s.tokens)[:room]
        eos = self.backend.eos_token_id
        if eos in drafts:   # an accepted EOS ends the sequence: leave it to the step's own token
            drafts = drafts[:drafts.index(eos)]
        return drafts

    def step(self) -> list[Event]:
        events, self._events = self._events, []
        live = self.scheduler.schedule()
        if live:
            t0 = time.perf_counter()
            drafts = {id(s): d for s in live if (d := self._eligible(s))}
            batch = self._lagging(live)
            plain = [(s, toks) for s, toks in batch if id(s) not in drafts]
            spec = [(s, toks) for s, toks in batch if id(s) in drafts]
            controlled = [s for s in live if s.ctrl is not None]
            handle = self._submit(controlled)
            t1 = time.perf_counter()
            self._forward(plain)
            rows = {id(s): forward_positions(self.backend, s.cache, toks + drafts[id(s)], len(drafts[id(s)]) + 1)
                    for s, toks in spec}
            t2 = time.perf_counter()
            outcome = handle.wait() if handle is not None else None
            t3 = time.perf_counter()
            if spec and outcome is not None:   # the speculation's batches reuse the runtime's arrays: keep ours
                outcome.masks, outcome.kind = outcome.masks.copy(), outcome.kind.copy()
                outcome.temperature, outcome.elapsed_us = outcome.temperature.copy(), outcome.elapsed_us.copy()
            if spec:
                self._verify([s for s, _ in spec], drafts, rows, controlled, outcome, events)
            self._apply(live, controlled, outcome, events)
            t4 = time.perf_counter()
            self._count(sum(len(toks) for _, toks in batch), outcome, t1 - t0, t2 - t1, t3 - t2, t4 - t3)
        self._retire(events)
        return events

    def _verify(self, seqs: list[GenSeq], drafts: dict[int, list[int]], rows: dict[int, np.ndarray],
                controlled: list[GenSeq], outcome: "RowsOutcome | None", events: list[Event]) -> None:
        """Accept each sequence's drafts while they are the greedy token under the controller's
        mask; leave it with the logits (and, controlled, the mask) after the accepted ones for
        the engine's ordinary apply to sample the step's own token."""
        from ..core.speculate import Speculation
        mask_vocab = self.runtime.vocab_size if outcome is not None else 0
        at = {id(s): i for i, s in enumerate(controlled)}
        accepted: dict[int, int] = {}
        masked: list[GenSeq] = []
        for s in seqs:
            i = at.get(id(s))
            if s.ctrl is None:   # no controller: the logits alone decide
                d, logits = drafts[id(s)], rows[id(s)]
                a = 0
                while a < len(d) and int(np.argmax(logits[a])) == d[a]:
                    a += 1
                accepted[id(s)] = a
            elif outcome is not None and outcome.kind[i] == _MASK and outcome.temperature[i] != outcome.temperature[i]:
                masked.append(s)
            else:   # a rare result this step (or a branch temperature): no speculation
                accepted[id(s)] = 0
        if masked:
            assert outcome is not None
            t0 = time.perf_counter()
            n = len(masks_now := [outcome.masks[at[id(s)]].copy() for s in masked])
            spec = Speculation(self.runtime, np.array([s.ctrl.index for s in masked]))
            cur = masks_now
            live_rows = list(range(n))
            acc = [0] * n
            ended: dict[int, tuple] = {}
            depth = 0
            while live_rows:
                toks = np.full(n, -1, dtype=np.int64)
                for r in list(live_rows):
                    s = masked[r]
                    d = drafts[id(s)]
                    if depth < len(d) and _masked_argmax(rows[id(s)][depth], cur[r], mask_vocab) == d[depth]:
                        toks[r] = d[depth]
                    else:
                        live_rows.remove(r)
                if not live_rows:
                    break
                out = spec.extend(toks)
                self.spec_stats["draft_rows"] += len(live_rows)
                for r in list(live_rows):
                    t = out.temperature[r]
                    if out.ok[r] and t != t:   # a plain mask, the request's own temperature (greedy)
                        acc[r] += 1
                        cur[r] = out.masks[r]
                        continue
                    live_rows.remove(r)
                    res = spec.ended_result(r)
                    if not out.ok[r] and res is not None and res.status != "pending" and len(res.branches) <= 1:
                        acc[r] += 1   # the draft was the greedy token: accepted, and this step applies its result
                        ended[r] = (res, spec.ended_masks(r))
                depth += 1
            spec.commit(np.array(acc, dtype=np.int64))
            extra: list[np.ndarray] = []
            base = len(outcome.masks)
            for r, s in enumerate(masked):
                i = at[id(s)]
                accepted[id(s)] = acc[r]
                outcome.masks[i] = cur[r]   # the step's own token: under the mask after the drafts
                if r in ended:   # ...or the result after the last accepted draft, applied as this step's
                    res, own = ended[r]
                    if own is not None:
                        res = dataclasses.replace(res, branches=[
                            b if b.mask_row is None else dataclasses.replace(b, mask_row=base + b.mask_row)
                            for b in res.branches])
                        extra.append(own)
                        base += len(own)
                    outcome.kind[i] = _OTHER
                    outcome.results[i] = res
            if extra:
                outcome.masks = np.concatenate([outcome.masks, *extra])
            self.spec_stats["draft_us"] += (time.perf_counter() - t0) * 1e6
        self.spec_stats["steps"] += 1
        for s in seqs:
            d, a = drafts[id(s)], accepted[id(s)]
            self.spec_stats["drafted"] += len(d)
            self.spec_stats["accepted"] += a
            kept = len(s.tokens) + a
            s.tokens.extend(d[:a])
            s.generated += a
            if s.ctrl is not None and a:
                s.unchanged = s.synced = kept   # the controller has seen the accepted drafts
            self.backend.backtrack(s.cache, kept)
            s.logits = rows[id(s)][a]
            if a:
                events.append(TokensEvent(s.request, s, 0, list(d[:a])))
