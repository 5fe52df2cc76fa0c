"""`aicirt.engine`'s protocol over vLLM: the whole of docs/protocol.md#semantics (masks, temperature, splices,
conditional splices, backtrack into the prompt, forks, waits, stop) on vLLM's scheduler, paged KV
cache and prefix caching. `aicirt run --engine vllm` and `aicirt serve --engine vllm` use it.

One process decides: the engine drives an in-process vLLM `EngineCore` (no engine-core process)
one step at a time, as `EngineCore.step` does, with the controllers in between:

    so = scheduler.schedule()                       # vLLM picks the batch
    handle = runtime.submit_rows(ready)             # controllers start (worker threads) ...
    future = executor.execute_model(so)             # ... while the forward pass runs (every TP rank)
    outcome = handle.wait()
    grammar = bitmask of the masks                  # shipped to every TP rank with the sampling
    out = executor.sample_tokens(grammar)           # vLLM samples under the masks (seeded)
    scheduler.update_from_output(so, out)
    apply: splices, forks, stops (aicirt.engine.apply)

So the masks reach every rank through vLLM's structured-output path and every decision is taken
once, in this process: tensor-parallel ranks cannot diverge on a controller's timing.

Edits are restarts: a sequence whose tokens vLLM does not hold (a splice, a backtrack, a fork, a
late controller whose step's token is dropped) is aborted in vLLM and added again with its edited
tokens as the prompt. Prefix caching turns that re-prefill into the tokens past the last full KV
block the edit kept, in one forward pass: a fast-forward of k tokens costs the pass that forwards
them (as on the own engine), not k passes; a backtrack recomputes less than one block; a fork's
branches share every full block of the prefix. A fork's new branch, and a branch asking for a
temperature its vLLM request does not have, samples in the next step from its own (restarted)
request: one extra pass for that branch (docs/vllm.md has the costs, measured).

Observable results (tokens, forks, variables, finish reasons, errors) are the own engine's: the
same `GenRequest`/`GenSeq`/events, the same `Applier` for splices, stops and finishes.
Not thread-safe: one thread drives it, as `aicirt.engine.Engine`.
"""
from __future__ import annotations

import itertools
import os
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..abi import RowKind
from ..capabilities import Capabilities
from .apply import Applier, _Draw
from .engine import EngineBase
from .backends.base import KVCache, TokenId
from .backends.transformers_backend import TransformersBackend, _cpu_has_fast_bf16
from .sampling import SamplingParams
from .scheduler import Scheduler
from .types import EngineStats, Event, GenRequest, GenSeq, LogEvent

if TYPE_CHECKING:
    from vllm.inputs import TokensPrompt

    from ..core.batch import RowsOutcome
    from ..limits import Limits
    from ..core.results import StepResult
    from ..core.runtime import Runtime

#: KV block size asked of vLLM (its CPU backend defaults to 128 and prefers multiples of 32): a
#: backtrack or a restart recomputes at most one block, so smaller is cheaper to edit.
BLOCK_SIZE = 32


def vllm_dtype() -> str:
    """The dtype to ask vLLM for on CPU: bfloat16 only where the CPU has native bf16 dot products
    (AVX512-BF16 or AMX), as the own engine chooses; float32 otherwise (emulated bf16 ran 3-6x
    slower here)."""
    return "bfloat16" if _cpu_has_fast_bf16() else "float32"


class VllmBackend(TransformersBackend):
    """The model's tokenizer, EOS and vocabulary width for the engine, the server and the runtime;
    no weights (vLLM holds them). Its caches are handles to vLLM requests (`_VReq`)."""

    name = "vllm"

    def __init__(self, folder: Path, vocab_size: int, max_model_len: int) -> None:  # no super(): no weights
        from types import SimpleNamespace

        from transformers import AutoTokenizer

        self.model_dir = folder
        self.hf_tokenizer = AutoTokenizer.from_pretrained(folder)
        self.vocab_size = vocab_size
        self.config = SimpleNamespace(max_position_embeddings=max_model_len)   # the server's context
        eos = self.hf_tokenizer.eos_token_id
        self.eos_token_id = int(eos[0] if isinstance(eos, (list, tuple)) else eos)
        self._runtime_tokenizer = None

    def new_cache(self) -> KVCache:
        return KVCache(state=_VReq())

    def fork(self, cache: KVCache) -> KVCache:
        return KVCache(length=cache.length, state=_VReq())

    def backtrack(self, cache: KVCache, length: int) -> None:
        cache.length = length        # the restart (VllmEngine._sync) recomputes what changed

    def free(self, cache: KVCache) -> None:
        cache.freed = True
        cache.state.finished = True

    def forward(self, batch: Sequence[tuple[KVCache, Sequence[TokenId]]]) -> np.ndarray:
        raise NotImplementedError("VllmBackend has no forward pass of its own: VllmEngine steps vLLM")

    def close(self) -> None:
        pass


@dataclass(eq=False)
class _VReq:
    """A sequence's vLLM request: its id (None: none in vLLM now), the tokens vLLM holds for it,
    its temperature, and a draw put off to the next step (a fork's branch, a temperature change)."""
    rid: str | None = None
    tokens: list[int] = field(default_factory=list)
    temperature: float = 0.0
    draw: tuple | None = None          # (mask row or None, temperature, splices)
    finished: bool = False             # the sequence ended: abort its request
    restarts: int = 0
    fresh: bool = False                # added since its last schedule (for `VllmEngine.starts`)


class VllmEngine(EngineBase):
    """`aicirt.engine.Engine`'s interface (`add_request`, `step`, `abort`, `run`, `generate`,
    `close`, `backend`, `runtime`, `stats`) over an in-process vLLM engine.

    `model`: as `aicirt run --model` takes it (None: SmolLM2, converted once) or a Hugging Face
    folder. `dtype`: "auto" (`vllm_dtype()`) or a vLLM dtype. `engine_args`: more
    `vllm.EngineArgs` fields (they win over the defaults here; `parse_vllm_args`). Raises
    `ImportError` without vLLM, `FileNotFoundError` for a model that cannot be found,
    `ValueError` for `data_parallel_size` > 1 (one engine per data-parallel rank: `aicirt.integrations.vllm_dp`).
    """

    def __init__(self, model: str | os.PathLike[str] | None = None, runtime: Runtime | None = None, *,
                 workers: int = 2, limits: Limits | None = None, tensor_parallel_size: int = 1,
                 data_parallel_size: int = 1, dtype: str = "auto", max_model_len: int | None = 2048, seed: int = 0,
                 engine_args: dict[str, Any] | None = None) -> None:
        if data_parallel_size != 1:
            raise ValueError(f"data_parallel_size {data_parallel_size}: this engine drives one vLLM engine core in "
                             "its own process; `aicirt serve --engine vllm --data-parallel-size N` runs N of them "
                             "(aicirt.integrations.vllm_dp), or run one server per rank behind a load balancer, "
                             "sharing the controller store (docs/deployment.md)")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"   # the EngineCore in this process
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        # vLLM logs to stdout, at INFO: keep stdout for the output (`aicirt run --json`)
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.core.sched.scheduler import Scheduler as VScheduler
        from vllm.v1.engine.core_client import InprocClient
        from vllm.v1.engine.llm_engine import LLMEngine

        from .backends.model_files import local_model_dir

        folder = Path(local_model_dir(model))
        kw: dict[str, Any] = dict(model=str(folder), dtype=vllm_dtype() if dtype == "auto" else dtype,
                                  enforce_eager=True, tensor_parallel_size=tensor_parallel_size, seed=seed,
                                  max_model_len=max_model_len, block_size=BLOCK_SIZE, enable_prefix_caching=True,
                                  async_scheduling=False, generation_config="vllm", max_logprobs=20)
        kw.update(engine_args or {})
        self.engine_args = kw
        self.llm_engine = LLMEngine.from_engine_args(EngineArgs(**kw))
        client = self.llm_engine.engine_core
        assert isinstance(client, InprocClient)     # VLLM_ENABLE_V1_MULTIPROCESSING=0, above
        self.core = client.engine_core
        assert isinstance(self.core.scheduler, VScheduler)   # V1's (async_scheduling=False): requests, KV manager
        self._vsched = self.core.scheduler
        self.block_size = int(self.core.vllm_config.cache_config.block_size)
        self.max_model_len = int(self.core.vllm_config.model_config.max_model_len)
        vocab = int(self.core.vllm_config.model_config.get_vocab_size())
        self.backend = VllmBackend(folder, vocab, self.max_model_len)
        self._words = (vocab + 31) // 32
        self._runtime = runtime
        self._owns_runtime = runtime is None
        self._workers, self._limits = workers, limits
        self.scheduler = Scheduler()
        self._applier = Applier(self.backend)
        self.stats = EngineStats()
        self.passes = 0                              # vLLM steps that ran the model
        self.restarts = 0                            # vLLM requests added (first starts and edits)
        #: The latest starts: (request id, sequence label, tokens, tokens computed in its first
        #: step); the difference is what prefix caching reused (KV blocks times the block size).
        self.starts: deque[tuple[int, int, int, int]] = deque(maxlen=4096)
        self._ids = itertools.count()
        self._rids = itertools.count()
        self._events: list[Event] = []
        self._by_rid: dict[str, GenSeq] = {}
        self._closed = False
        self._supported = self.llm_engine.get_supported_tasks()

    # --- what Engine offers --------------------------------------------------------------------
    def use_runtime(self, runtime: Runtime) -> None:
        """Run controllers on `runtime` (the caller's, over `self.backend.runtime_tokenizer()`;
        it outlives the engine). Before the first controlled request only."""
        if self._runtime is not None:
            raise ValueError("the engine already has a runtime")
        self._runtime, self._owns_runtime = runtime, False

    def add_request(self, prompt: str | list[int], controller: Any = None, arg: bytes | str = b"", *,
                    capabilities: Capabilities | None = None, params: SamplingParams | None = None,
                    chat: bool = True) -> GenRequest:
        """As `aicirt.engine.Engine.add_request`; also a `ValueError` for a prompt longer than the
        model's context."""
        if self._closed:
            raise ValueError("engine closed")
        params = params or SamplingParams()
        tokens = self._prompt_tokens(prompt, chat)
        if len(tokens) >= self.max_model_len:
            raise ValueError(f"the prompt has {len(tokens)} tokens; the model's context is {self.max_model_len}")
        ctrl, seq_ctrl, spawn_error = self._start_controller(controller, arg, capabilities)
        req = GenRequest(id=next(self._ids), prompt=tokens, params=params,
                         rng=np.random.default_rng(params.seed), ctrl=ctrl)
        seq = GenSeq(req, label=0, tokens=list(tokens), cache=self.backend.new_cache(), ctrl=seq_ctrl)
        req.sequences.append(seq)
        if spawn_error is not None:
            self._applier.finish(seq, "error", spawn_error, self._events)
        self.scheduler.add(req)
        return req

    def abort(self, request: GenRequest, reason: str = "abort") -> None:
        """As `aicirt.engine.Engine.abort`; the vLLM requests go with the next step."""
        super().abort(request, reason)
        self._drop_finished()

    # --- one step --------------------------------------------------------------------------
    def step(self) -> list[Event]:
        """One vLLM step for every live sequence vLLM schedules; what happened since the last step."""
        events, self._events = self._events, []
        live = self.scheduler.schedule()
        if live:
            self._step(live, events)
        self._drop_finished()
        self._retire(events)
        return events

    def _step(self, live: list[GenSeq], events: list[Event]) -> None:
        t0 = time.perf_counter()
        for s in live:
            self._sync(s, events)
        live = [s for s in live if s.finish_reason is None]
        sched = self._vsched
        so = sched.schedule()   # even with nothing to run, the step tells the workers what finished
        for s in live:
            st = s.cache.state
            if st.fresh and st.rid in so.num_scheduled_tokens:
                st.fresh = False
                self.starts.append((s.request.id, s.label, len(st.tokens), so.num_scheduled_tokens[st.rid]))
        ready = [s for s in live if s.cache.state.rid in so.num_scheduled_tokens
                 and not sched.requests[s.cache.state.rid].is_prefill_chunk]
        controlled = [s for s in ready if s.ctrl is not None and s.cache.state.draw is None]
        handle = self._submit(controlled)
        t1 = time.perf_counter()
        future = self.core.model_executor.execute_model(so, non_block=True)
        outcome = handle.wait() if handle is not None else None
        t2 = time.perf_counter()
        draws: dict[GenSeq, tuple] = {}
        for s in ready:
            if s.cache.state.draw is not None:
                draws[s], s.cache.state.draw = s.cache.state.draw, None
            elif s.ctrl is None:
                s.sampled = None
                draws[s] = (None, s.request.params.temperature, ())
        if outcome is not None:
            self._plan(controlled, outcome, draws, events)
        grammar = self._grammar(draws)
        model_output = future.result()
        if model_output is None:
            model_output = self.core.model_executor.sample_tokens(grammar)
        t3 = time.perf_counter()
        outputs = sched.update_from_output(so, model_output)
        self.passes += so.total_num_scheduled_tokens > 0
        sampled: dict[str, list[int]] = {}
        logprobs: dict[str, Any] = {}
        ended: set[str] = set()
        for eco in outputs.values():
            for o in eco.outputs:
                sampled[o.request_id] = list(o.new_token_ids)
                if o.new_logprobs is not None:
                    logprobs[o.request_id] = o.new_logprobs
                if o.finish_reason is not None:
                    ended.add(o.request_id)
        for s in ready:
            st = s.cache.state
            got = sampled.get(st.rid, ())
            st.tokens.extend(got)
            if st.rid in ended:
                self._by_rid.pop(st.rid, None)
                st.rid = None
            d = draws.get(s)
            if d is None or not got or s.finish_reason is not None:
                continue
            mask, temperature, splices = d
            draw = _Draw(s, None, mask, temperature, splices)  # type: ignore[arg-type]
            draw.token = got[0]
            if mask is not None and not _allowed(mask, draw.token):
                draw.error = "no token can be sampled: every logit is -inf or NaN"
            top = s.request.params.logprobs
            lp = logprobs.get(st.rid) if top is not None else None
            if lp is not None and top is not None:   # vLLM's raw logprobs: the logits under the mask, at T=1
                ids, vals = lp.logprob_token_ids[0], lp.logprobs[0]
                draw.logprob = (float(vals[0]), tuple((int(t), float(v)) for t, v in zip(ids[1:top + 1], vals[1:top + 1])
                                                      if np.isfinite(v)))
            self._applier._commit(draw, events)
            if s.finish_reason is None and st.rid is None and st.tokens == s.tokens:
                self._applier.finish(s, "length", None, events)   # vLLM ended it: the context is full
        self._count(so.total_num_scheduled_tokens, outcome, t1 - t0, t3 - t1, t2 - t1, time.perf_counter() - t3)

    def _sync(self, s: GenSeq, events: list[Event]) -> None:
        """Restart `s`'s vLLM request when vLLM does not hold exactly its tokens (or the
        temperature its put-off draw asks for): abort it, add it again with the edited tokens."""
        st: _VReq = s.cache.state
        want_t = st.draw[1] if st.draw is not None else s.request.params.temperature
        if st.rid is not None and st.tokens == s.tokens and st.temperature == want_t:
            return
        if st.rid is not None:
            self.core.abort_requests([st.rid])
            self._by_rid.pop(st.rid, None)
            st.rid = None
        if len(s.tokens) >= self.max_model_len:
            self._applier.finish(s, "length", None, events)
            return
        from vllm import SamplingParams as VParams

        p = s.request.params
        seed = None if p.seed is None else (p.seed * 1_000_003 + s.label * 7919 + st.restarts) % (2 ** 63)
        vp = VParams(temperature=want_t, top_p=p.top_p, top_k=p.top_k if p.top_k > 0 else 0, seed=seed,
                     max_tokens=self.max_model_len - len(s.tokens), ignore_eos=True, detokenize=False,
                     skip_special_tokens=False, logprobs=p.logprobs)
        rid = f"aicirt-{s.request.id}-{s.label}-{next(self._rids)}"
        ecr = self.llm_engine.input_processor.process_inputs(
            # a TokensPrompt; a cast: mypy (python_version 3.10) reads vLLM's typing.NotRequired keys as required
            rid, cast("TokensPrompt", {"prompt_token_ids": list(s.tokens)}), vp, supported_tasks=self._supported)
        self.llm_engine.input_processor.assign_request_id(ecr)
        self.core.add_request(*self.core.preprocess_add_request(ecr))
        st.rid, st.tokens, st.temperature = ecr.request_id, list(s.tokens), want_t
        st.restarts += 1
        st.fresh = True
        self.restarts += 1
        self._by_rid[st.rid] = s

    def _plan(self, controlled: list[GenSeq], outcome: RowsOutcome, draws: dict[GenSeq, tuple],
              events: list[Event]) -> None:
        """Each controller's result: a draw for vLLM to sample (mask, temperature, splices), or an
        edit made now (splice without sampling, no-op, stop, error). As `Applier.apply`."""
        masks, kind, temperature, elapsed = outcome.masks, outcome.kind, outcome.temperature, outcome.elapsed_us
        for i, s in enumerate(controlled):
            k = kind[i]
            if k == RowKind.MASK:
                s.controller_us += elapsed[i]
                t = temperature[i]
                self._draw(s, masks[i], s.request.params.temperature if t != t else float(t), (), draws)
            elif k == RowKind.OTHER:
                self._plan_result(s, outcome.results[i], masks, draws, events)

    def _plan_result(self, s: GenSeq, r: StepResult, masks: np.ndarray, draws: dict[GenSeq, tuple],
                     events: list[Event]) -> None:
        s.controller_us += r.elapsed_us
        if r.logs:
            s.logs.append(r.logs)
            events.append(LogEvent(s.request, s, r.logs))
        if r.status == "pending":
            return      # late: this step's token is dropped (a restart); the result comes later
        if r.status == "error":
            self._applier.finish(s, "error", r.error, events)
            return
        if not r.branches:
            self._applier.finish(s, "stop", None, events)
            return
        targets = [s, *self._applier.fork(s, r.forks, events)]
        temperature = s.request.params.temperature
        for target, branch in zip(targets, r.branches):
            if branch.mask_row is None:
                self._applier._splice(target, branch.splices[0], events)
                continue
            t = temperature if branch.temperature is None else branch.temperature
            mask = np.array(masks[branch.mask_row], copy=True)
            if target is s:
                self._draw(s, mask, t, tuple(branch.splices), draws)
            else:   # a new branch samples from its own vLLM request, next step
                target.cache.state.draw = (mask, t, tuple(branch.splices))

    def _draw(self, s: GenSeq, mask: np.ndarray | None, t: float, splices: tuple, draws: dict) -> None:
        """Sample `s` this step, unless its vLLM request has another temperature: then next step,
        from a request restarted at `t`."""
        if t == s.cache.state.temperature:
            draws[s] = (mask, t, splices)
        else:
            s.cache.state.draw = (None if mask is None else np.array(mask, copy=True), t, splices)
            s.cache.state.tokens = []      # force the restart

    def _grammar(self, draws: dict[GenSeq, tuple]) -> Any:
        """vLLM's structured-output bitmask (int32, the model's vocabulary wide) for the masked draws."""
        rows = [(s.cache.state.rid, m) for s, (m, _, _) in draws.items() if m is not None]
        if not rows:
            return None
        from vllm.v1.core.sched.output import GrammarOutput

        bits = np.zeros((len(rows), self._words), dtype=np.uint32)
        for j, (_, m) in enumerate(rows):
            w = min(len(m), self._words)
            bits[j, :w] = m[:w]
        return GrammarOutput([rid for rid, _ in rows], bits.view(np.int32))

    def _drop_finished(self) -> None:
        """Abort the vLLM requests of sequences that ended."""
        gone = [rid for rid, s in self._by_rid.items() if s.finish_reason is not None]
        if gone:
            self.core.abort_requests(gone)
            for rid in gone:
                self._by_rid.pop(rid).cache.state.rid = None

    def prefix_cache_stats(self) -> tuple[int, int]:
        """(queries, hits) of vLLM's prefix cache, in tokens, since the engine started."""
        st = self._vsched.kv_cache_manager.prefix_cache_stats
        return (int(getattr(st, "queries", 0)), int(getattr(st, "hits", 0))) if st is not None else (0, 0)

    def close(self) -> None:
        """Free every request and controller, the runtime if this engine made it, and vLLM's
        executor. Idempotent."""
        if self._closed:
            return
        self._release_all()
        try:
            self.core.shutdown()
        except Exception:  # noqa: BLE001 - shutting down what is left
            pass

    def __enter__(self) -> VllmEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parse_vllm_args(items: Iterable[str]) -> dict[str, Any]:
    """`KEY=VALUE` texts (`--vllm-arg`) as `vllm.EngineArgs` fields: dashes in KEY become
    underscores; VALUE is read as JSON where it parses (numbers, true/false, null, lists,
    objects), else kept as text. Raises `ValueError` for a malformed item or an unknown field."""
    import dataclasses
    import json

    from vllm.engine.arg_utils import EngineArgs

    known = {f.name for f in dataclasses.fields(EngineArgs)}
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ValueError(f"--vllm-arg takes KEY=VALUE, got {item!r}")
        if key not in known:
            raise ValueError(f"--vllm-arg {key}: not a vllm.EngineArgs field")
        try:
            out[key] = json.loads(text)
        except ValueError:
            out[key] = text
    return out


def _allowed(mask: np.ndarray, token: int) -> bool:
    w = token >> 5
    return w < len(mask) and bool((int(mask[w]) >> (token & 31)) & 1)
