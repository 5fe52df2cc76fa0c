"""aicirt controllers inside vLLM: a V1 logits processor (Model Runner V1, e.g. vLLM's CPU build).

    vllm serve MODEL --logits-processors aicirt.integrations.vllm:AicirtLogitsProcessor
    LLM(model=..., logits_processors=[AicirtLogitsProcessor])

A request opts in with ``SamplingParams(extra_args={"aicirt_controller": REF, "aicirt_arg": ARG})``
(through the OpenAI server: the same flat keys in ``vllm_xargs``). REF is a module id or a tag in
the controller store (`aicirt.serve.store`), a shipped controller's name (``regex``), or, unless
``AICIRT_VLLM_ALLOW_PATHS=0``, a ``.wasm`` path or a C/Zig source file or folder (built once,
cached). ARG is a string (or a number, sent as its decimal text). Requests without the key are
left alone.

Per step: `update_state` (before the forward pass) starts `mid-process` for every controlled row,
and `apply` (after it) waits and masks all controlled rows in one vectorised operation. The
runtime, its worker threads and the tokenizer (the model's own) live in the worker process that
runs this processor (one per tensor-parallel rank; controllers are deterministic, so all ranks
agree). What the controller is granted, and why, is in `aicirt.integrations.steering` and
docs/vllm.md. A controller error ends its request: the request's output ends with
``[aicirt error: ...]`` and the worker logs the message (logger ``aicirt.integrations``).

vLLM's async scheduling is refused at load: with it the previous step's token is not yet in the
output list at `update_state`, so the controller could not be called during the forward pass.
The CPU build turns it off itself; on GPUs pass ``--no-async-scheduling``. Speculative decoding
is refused by vLLM itself for custom logits processors.
"""
from __future__ import annotations

import logging
import os
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from ..limits import Limits
from ..runtime import Runtime
from ..tokenizer import HFTokenizer
from .steering import Steered, Steering
from .torch_masks import apply_plan

CONTROLLER_KEY = "aicirt_controller"
ARG_KEY = "aicirt_arg"
_KEYS = (CONTROLLER_KEY, ARG_KEY)

#: Requests taken out of the batch unfinished (preempted) whose controller is kept for their return.
MAX_PARKED = 256

log = logging.getLogger("aicirt.integrations")


def request_controller(params: SamplingParams) -> tuple[str, str] | None:
    """`(controller reference, argument)` of a request, None when it has no controller.
    Raises ValueError for a malformed request (wrong types, an unknown ``aicirt_*`` key)."""
    extra = params.extra_args or {}
    unknown = sorted(k for k in extra if isinstance(k, str) and k.startswith("aicirt_") and k not in _KEYS)
    if unknown:
        raise ValueError(f"unknown aicirt key(s) {unknown}: the keys are {list(_KEYS)}")
    ref = extra.get(CONTROLLER_KEY)
    if ref is None:
        if ARG_KEY in extra:
            raise ValueError(f"{ARG_KEY} given without {CONTROLLER_KEY}")
        return None
    if not isinstance(ref, str) or not ref:
        raise ValueError(f"{CONTROLLER_KEY} must be a non-empty string (a shipped name or a path), got {ref!r}")
    arg = extra.get(ARG_KEY, "")
    if isinstance(arg, bool) or not isinstance(arg, (str, int, float)):
        raise ValueError(f"{ARG_KEY} must be a string or a number, got {type(arg).__name__}")
    return ref, arg if isinstance(arg, str) else str(arg)


def paths_allowed() -> bool:
    """Whether a request may name a file on the server (`AICIRT_VLLM_ALLOW_PATHS`, default 1).
    Set it to 0 for a server that untrusted clients reach: they then name only tags, module ids
    and shipped controllers, as with aicirt's own server."""
    return os.environ.get("AICIRT_VLLM_ALLOW_PATHS", "1") != "0"


def resolve_reference(ref: str) -> Path:
    """The `.wasm` file for a controller reference (through the controller store: a module id, a
    tag, a shipped name, or a path where allowed), built and cached if it is a source. Raises
    ValueError with a message for the user."""
    from ..serve.store import StoreError, resolve_controller
    from ..toolchain import BuildError

    try:
        return resolve_controller(ref, allow_paths=paths_allowed())
    except (StoreError, BuildError, OSError) as e:
        why = str(e).removeprefix(f"{ref}: ")
        raise ValueError(f"{CONTROLLER_KEY} {ref!r}: {why}") from None


def _route_logs_to_vllm() -> None:
    """Our warnings (controller errors) in vLLM's log, with its format, where nothing else set ours up."""
    ours = logging.getLogger("aicirt")
    if not ours.handlers:
        for handler in logging.getLogger("vllm").handlers:
            ours.addHandler(handler)
        ours.setLevel(logging.INFO)
        ours.propagate = not ours.handlers


def model_tokenizer(folder: str, revision: str | None = None, trust_remote_code: bool = False) -> HFTokenizer:
    """The model's own tokenizer (a fast one, from its folder) as the runtime's tokenizer, with the
    EOS vLLM stops on. Raises ValueError for a slow-only tokenizer."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(folder, revision=revision, trust_remote_code=trust_remote_code)
    if not getattr(hf, "is_fast", False):
        raise ValueError(f"aicirt needs a fast (tokenizers) tokenizer for {folder}")
    return HFTokenizer(hf.backend_tokenizer, hf.eos_token_id)


class AicirtLogitsProcessor(LogitsProcessor):
    """vLLM V1 logits processor that runs each controlled request's aicirt controller."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """At admission (in the frontend process): a malformed request or a controller that
        cannot be found or built is a ValueError, which vLLM's server answers with HTTP 400."""
        found = request_controller(sampling_params)
        if found is not None:
            resolve_reference(found[0])

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        if getattr(vllm_config.scheduler_config, "async_scheduling", False):
            raise ValueError("aicirt's logits processor needs async scheduling off (--no-async-scheduling): "
                             "with it, a step's token is not known before the next forward pass")
        _route_logs_to_vllm()
        self.device = device
        mc = vllm_config.model_config
        tokenizer = model_tokenizer(mc.tokenizer, mc.tokenizer_revision, mc.trust_remote_code)
        self.runtime = Runtime(tokenizer, limits=Limits(), workers=2)
        self.steering = Steering(self.runtime, tokenizer.eos_token_id)
        self._controllers: dict[str, object] = {}
        self._rows: dict[int, tuple[SamplingParams, Steered]] = {}
        self._parked: OrderedDict[int, tuple[SamplingParams, Steered]] = OrderedDict()
        self._order: list[int] = []
        self._opened = 0
        self._warned: weakref.WeakSet[Steered] = weakref.WeakSet()   # told once: temperature not applied

    def is_argmax_invariant(self) -> bool:
        return False   # masks change the argmax

    # -- batch bookkeeping ---------------------------------------------------------------------
    def _open(self, params: SamplingParams, prompt: list[int] | None, output: list[int]) -> Steered | None:
        found = request_controller(params)
        if found is None:
            return None
        parked = self._parked.pop(id(params), None)
        if parked is not None and parked[0] is params:   # back from preemption: same state
            return parked[1]
        ref, arg = found
        ctrl = self._controllers.get(ref)
        if ctrl is None:
            try:
                ctrl = self._controllers[ref] = self.runtime.load(resolve_reference(ref))
            except Exception as e:  # validated at admission; still only this request's problem
                ctrl = f"controller {ref!r} failed to load: {e}"
        self._opened += 1
        return self.steering.open(ctrl, arg, prompt or [], output, label=f"aicirt#{self._opened} {ref[:60]!r}")

    def _release(self, params: SamplingParams, s: Steered) -> None:
        """A request left the batch: done (free it) or preempted (keep it for its return)."""
        done = s.finished or (params.max_tokens is not None and len(s.output) >= params.max_tokens) or (
            s.output and s.output[-1] == self.steering.eos_token_id)
        if done:
            s.close()
            return
        self._parked[id(params)] = (params, s)
        while len(self._parked) > MAX_PARKED:
            _, (_, old) = self._parked.popitem(last=False)
            old.close()

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is not None:
            for index in batch_update.removed:
                entry = self._rows.pop(index, None)
                if entry is not None:
                    self._release(*entry)
            for index, params, prompt, output in batch_update.added:
                old = self._rows.pop(index, None)
                if old is not None:
                    self._release(*old)
                s = self._open(params, prompt, output)
                if s is not None:
                    self._rows[index] = (params, s)
            for a, b, how in batch_update.moved:
                ea, eb = self._rows.pop(a, None), self._rows.pop(b, None)
                if ea is not None:
                    self._rows[b] = ea
                if how == MoveDirectionality.SWAP and eb is not None:
                    self._rows[a] = eb
                elif eb is not None:
                    self._release(*eb)
        self._order = sorted(self._rows)
        self.steering.begin([self._rows[i][1] for i in self._order])

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self._order:
            return logits
        plan = self.steering.end()
        entries = [self._rows[i] for i in self._order]
        request_t = [float(p.temperature) for p, _ in entries]
        exact = [not (p.presence_penalty or p.frequency_penalty) for p, _ in entries]
        skipped = apply_plan(logits, self._order, plan.masks, plan.temperatures, request_t, exact)
        for k in skipped:
            params, s = entries[k]
            if s not in self._warned:
                self._warned.add(s)
                log.warning("%s: branch temperature %s not applied (it is exact only for a request that samples "
                            "at T > 0 without presence/frequency penalties)", s.label, plan.temperatures[k])
        return logits
