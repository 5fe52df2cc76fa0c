"""What both of aicirt's vLLM logits processors (`vllm.AicirtLogitsProcessor` for the V1 model
runner, `vllm_mrv2.AicirtMRV2LogitsProcessor` for Model Runner V2) do alike with a request's
controller: open it (or take it back when its request returns from preemption) and, when the
request leaves the batch, free it or park it for its return.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm import SamplingParams

    from .. import Runtime            # the public name (stable across module moves)
    from .steering import Steered, Steering

#: Requests taken out of the batch unfinished (preempted) whose controller is kept for their return.
MAX_PARKED = 256


class RequestControllers:
    """A mixin: the processor sets `_eos`, `_controllers`, `_parked` and `_opened` in its
    constructor and provides `steering` (its runtime started on first use)."""

    _eos: int
    _controllers: dict[str, object]
    _parked: OrderedDict[int, tuple[SamplingParams, Steered]]
    _opened: int

    @property
    def steering(self) -> Steering:
        raise NotImplementedError

    @property
    def runtime(self) -> Runtime:
        """This worker's runtime (started on first use, see `steering`)."""
        return self.steering.runtime

    def _open_request(self, params: SamplingParams, prompt: list[int] | None, output: list[int]) -> Steered | None:
        """`params`' controller (None: the request names none): its parked one if it comes back
        from preemption, else a new one (a controller that fails to load: a message, so that the
        request fails alone)."""
        from .vllm import request_controller, resolve_reference   # loaded by now: vllm.py imports this module

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

    def _park_or_free(self, params: SamplingParams, s: Steered) -> None:
        """A request left the batch: done (free it) or preempted (keep it for its return)."""
        done = s.finished or (params.max_tokens is not None and len(s.output) >= params.max_tokens) or (
            s.output and s.output[-1] == self._eos)
        if done:
            s.close()
            return
        self._parked[id(params)] = (params, s)
        while len(self._parked) > MAX_PARKED:
            _, (_, old) = self._parked.popitem(last=False)
            old.close()
