"""aicirt controllers inside vLLM: a V1 logits processor (Model Runner V1, e.g. vLLM's CPU build).

    vllm serve MODEL --logits-processors aicirt.integrations.vllm:AicirtLogitsProcessor
    LLM(model=..., logits_processors=[AicirtLogitsProcessor])

A request opts in with ``SamplingParams(extra_args={"aicirt_controller": REF, "aicirt_arg": ARG})``
(through the OpenAI server: the same flat keys in ``vllm_xargs``). REF is a module id or a tag in
the controller store (`aicirt.serve.store`) or a shipped controller's name (``regex``); a
``.wasm`` path or a C/Zig source file or folder (built once, cached) only where the operator opts
in with ``AICIRT_VLLM_ALLOW_PATHS=1`` (see `paths_allowed`). ARG is a string (or a number, sent as
its decimal text). Requests without the key are left alone.

Per step: `update_state` (before the forward pass) starts `mid-process` for every controlled row,
and `apply` (after it) waits and masks all controlled rows in one vectorised operation. The
runtime, its worker threads and the tokenizer (the model's own) live in the worker process that
runs this processor (one per tensor-parallel rank; controllers are deterministic, so all ranks
agree). What the controller is granted, and why, is in `aicirt.integrations.steering` and
docs/vllm.md. A controller error ends its request: the request's output ends with
``[aicirt error: ...]`` and the worker logs the message (logger ``aicirt.integrations``).

Async scheduling is handled: with it the previous step's token is still a placeholder (-1) in
the output list at `update_state`, and vLLM writes it in just before `apply`; the controllers
then start in `apply` instead, so their time is not hidden behind the forward pass (docs/vllm.md).
Speculative decoding is refused by vLLM itself for custom V1 logits processors; under Model
Runner V2 (the GPU default) the same class name builds `vllm_mrv2`'s processor, which masks
draft rows.
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

from ..errors import LoadError
from ..limits import Limits
from ..core.runtime import Runtime
from ..host.tokenizer import HFTokenizer
from .admission import FirstCallCheck
from .steering import Steered, Steering
from .torch_masks import MaskBiases, apply_plan
from .vllm_requests import RequestControllers

CONTROLLER_KEY = "aicirt_controller"
ARG_KEY = "aicirt_arg"
_KEYS = (CONTROLLER_KEY, ARG_KEY)

log = logging.getLogger("aicirt.integrations")

#: The admission check's runtime (started by the first controlled request the frontend sees):
#: one per process, because vLLM calls `validate_params` on the class.
_first_call = FirstCallCheck()


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


#: The operator's switch that lets requests name files on the server (off unless set to 1).
ALLOW_PATHS_ENV = "AICIRT_VLLM_ALLOW_PATHS"


def paths_allowed() -> bool:
    """Whether a request may name a file on the server: only where the operator set
    ``AICIRT_VLLM_ALLOW_PATHS=1`` (unset, empty or 0: no). Off by default because a client that
    names a path learns whether it exists, and naming a source file makes the server compile it.
    Raises ValueError for any other value (a typo must not open or close it silently)."""
    value = os.environ.get(ALLOW_PATHS_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{ALLOW_PATHS_ENV} must be 0 or 1, got {value!r}")
    return value == "1"


def resolve_reference(ref: str) -> Path:
    """The `.wasm` file for a controller reference (through the controller store: a module id, a
    tag, a shipped name, or a path where `paths_allowed`), built and cached if it is a source.

    Raises ValueError with a message for the (possibly remote) client. A build or read error's
    message never quotes the compiler's diagnostics, which quote the source's lines: those go to the
    server's log (logger ``aicirt.integrations``), and the client is told to look there."""
    from ..serve.store import StoreError, resolve_controller
    from ..build.toolchain import BuildError

    try:
        return resolve_controller(ref, allow_paths=paths_allowed())
    except BuildError as e:
        log.warning("%s %r does not build: %s", CONTROLLER_KEY, ref, e.message)
        raise ValueError(f"{CONTROLLER_KEY} {ref!r}: the controller does not build (the compiler's "
                         f"diagnostics are in the server's log)") from None
    except StoreError as e:
        why = str(e).removeprefix(f"{ref}: ")
        raise ValueError(f"{CONTROLLER_KEY} {ref!r}: {why}") from None
    except OSError as e:   # names a server path: the log has it
        log.warning("%s %r could not be read: %s", CONTROLLER_KEY, ref, e)
        raise ValueError(f"{CONTROLLER_KEY} {ref!r}: the controller could not be read on the server "
                         f"(the server's log says why)") from None


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


class AicirtLogitsProcessor(LogitsProcessor, RequestControllers):
    """vLLM V1 logits processor that runs each controlled request's aicirt controller."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """At admission (in the frontend process): a malformed request, a controller that cannot
        be found or built, or one that refuses its argument on its first call is a ValueError,
        which vLLM's server answers with HTTP 400 (`LLM.generate` raises VLLMValidationError).

        vLLM gives this hook the SamplingParams only (no prompt, no tokenizer), so the first
        call runs on a stand-in (`aicirt.integrations.admission`): what a controller decides from
        its argument alone is caught here; the rest ends the request with the message in its
        output."""
        found = request_controller(sampling_params)
        if found is None:
            return
        ref, arg = found
        if ref == "program":   # steps vLLM cannot host (fork) are refused before the run (docs/protocol.md#hosts)
            from ..program import ProgramError, capability_refusal
            from .steering import MASK_ONLY_CAPABILITIES
            try:
                why = capability_refusal(arg, MASK_ONLY_CAPABILITIES)
            except ProgramError as e:
                raise ValueError(f"{CONTROLLER_KEY} 'program' refused its argument: program: {e}") from None
            if why is not None:
                raise ValueError(f"{CONTROLLER_KEY} 'program' refused its argument: program: {why}")
        path = resolve_reference(ref)
        try:
            why = _first_call.refusal(path, arg)
        except LoadError as e:
            raise ValueError(f"{CONTROLLER_KEY} {ref!r}: {e}") from None
        if why is not None:
            raise ValueError(f"{CONTROLLER_KEY} {ref!r} refused its argument: {why}")

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        """Checks the settings and loads the model's tokenizer; the runtime (its worker threads,
        its epoch ticker, the token trie) starts only with the first controlled request, so a
        server that never sees one pays nothing per step. Raises ValueError for a slow-only
        tokenizer or a bad ``AICIRT_VLLM_ALLOW_PATHS``."""
        paths_allowed()   # a bad value stops the engine here, not each request
        _route_logs_to_vllm()
        self.device = device
        mc = vllm_config.model_config
        self._tokenizer = model_tokenizer(mc.tokenizer, mc.tokenizer_revision, mc.trust_remote_code)
        self._eos = int(self._tokenizer.eos_token_id)
        self._steering: Steering | None = None
        self._controllers: dict[str, object] = {}
        self._rows: dict[int, tuple[SamplingParams, Steered]] = {}
        self._parked: OrderedDict[int, tuple[SamplingParams, Steered]] = OrderedDict()
        self._order: list[int] = []               # the controlled rows, ascending
        self._batch: list[Steered] = []           # their requests, in that order
        self._request_t: list[float] = []
        self._exact: list[bool] = []
        self._biases = MaskBiases()
        self._opened = 0
        self._warned: weakref.WeakSet[Steered] = weakref.WeakSet()   # told once: temperature not applied
        self._deferred = False   # async scheduling: a token still a placeholder, the calls start in apply

    @property
    def steering(self) -> Steering:
        """The steering core over this worker's runtime, made on first use (the first controlled
        request)."""
        if self._steering is None:
            runtime = Runtime(self._tokenizer, limits=Limits(), workers=2)
            self._steering = Steering(runtime, self._eos)
        return self._steering

    @property
    def started(self) -> bool:
        """Whether the runtime has started (a controlled request has been seen)."""
        return self._steering is not None

    def is_argmax_invariant(self) -> bool:
        return False   # masks change the argmax

    # -- batch bookkeeping ---------------------------------------------------------------------
    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Before the forward pass: follow vLLM's row changes, then start the controllers of the
        controlled rows. With none (and no step of theirs still out) it does nothing more."""
        if batch_update is not None and (batch_update.added or self._rows):
            self._follow(batch_update)
        if self._batch:
            # async scheduling: last step's token is still a placeholder (-1) until just before apply
            self._deferred = any(s.output and s.output[-1] < 0 for s in self._batch)
            if not self._deferred:
                self.steering.begin(self._batch)
        elif self._steering is not None and self._steering.pending:
            self._steering.end()   # a step vLLM skipped, and its rows are gone: take its results in

    def _follow(self, batch_update: BatchUpdate) -> None:
        for index in batch_update.removed:
            entry = self._rows.pop(index, None)
            if entry is not None:
                self._park_or_free(*entry)
        for index, params, prompt, output in batch_update.added:
            old = self._rows.pop(index, None)
            if old is not None:
                self._park_or_free(*old)
            s = self._open_request(params, prompt, output)
            if s is not None:
                self._rows[index] = (params, s)
        for a, b, how in batch_update.moved:
            ea, eb = self._rows.pop(a, None), self._rows.pop(b, None)
            if ea is not None:
                self._rows[b] = ea
            if how == MoveDirectionality.SWAP and eb is not None:
                self._rows[a] = eb
            elif eb is not None:
                self._park_or_free(*eb)
        self._order = sorted(self._rows)
        entries = [self._rows[i] for i in self._order]
        self._batch = [s for _, s in entries]
        self._request_t = [float(p.temperature) for p, _ in entries]
        self._exact = [not (p.presence_penalty or p.frequency_penalty) for p, _ in entries]

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """After the forward pass: wait for the controllers and mask the controlled rows in place."""
        if not self._order:
            return logits
        if self._deferred:
            self._deferred = False
            self.steering.begin(self._batch)
        plan = self.steering.end()
        skipped = apply_plan(logits, self._order, plan.masks, plan.temperatures, self._request_t, self._exact,
                             self._biases)
        for k in skipped:
            s = self._batch[k]
            if s not in self._warned:
                self._warned.add(s)
                log.warning("%s: branch temperature %s not applied (it is exact only for a request that samples "
                            "at T > 0 without presence/frequency penalties)", s.label, plan.temperatures[k])
        return logits


# The same name under Model Runner V2 (vLLM's GPU default): there it builds vllm_mrv2's processor.
from .vllm_mrv2 import both_runners  # noqa: E402

AicirtLogitsProcessor = both_runners(AicirtLogitsProcessor)  # type: ignore[misc, assignment]
