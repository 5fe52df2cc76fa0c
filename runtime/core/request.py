"""A request: one controller, its argument and capabilities, and the variables all its forks share."""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from ..capabilities import Capabilities
from ..owned import Owned

if TYPE_CHECKING:
    from ..loader.controller import Controller
    from ..native.types import CData
    from .runtime import Runtime
    from .sequence import Sequence


class Request(Owned):
    """Created by :meth:`Runtime.new_request`. Its variables are shared by every sequence of the
    request (all forks) and thread-safe: controllers on different worker threads may set them at
    once. `close()` closes its sequences."""

    def __init__(self, runtime: "Runtime", controller: "Controller", arg: bytes, capabilities: Capabilities):
        self.runtime = runtime
        self.controller = controller
        self.arg = controller.arg_prefix + bytes(arg)   # a bound script's (aicirt.loader.js_bind), then the request's
        self.arg_buffer = runtime.native.ffi.from_buffer(self.arg)   # read by the native `arg` import
        self.capabilities = Capabilities(capabilities)
        self.sequences: list["Sequence"] = []
        self.forks = 0
        self.vars = runtime.native.new_vars(runtime.limits.variable_bytes)
        # freed once nothing can reach it: a closing sequence's call may still read it
        weakref.finalize(self, self.vars.close)

    _slot_template: "CData | None" = None   # (a class default: speculate.py makes stand-ins without __init__)
    _prepare_key: tuple | None = None

    @property
    def prepare_key(self) -> tuple:
        """The key of its prepared state (core/prepared.py; computed once)."""
        if self._prepare_key is None:
            from .prepared import prepare_key
            self._prepare_key = prepare_key(self)
        return self._prepare_key

    @property
    def slot_template(self) -> "CData":
        """The native slot each of its sequences starts from: the runtime's (limits, vocabulary)
        with this request's capabilities, argument and variables (made on first use: a sequence
        then copies one struct instead of writing four fields through cffi)."""
        if self._slot_template is None:
            native = self.runtime.native
            slot = native.new_slot()
            native.ffi.memmove(slot, self.runtime.slot_template, native.slot_bytes)
            slot.capabilities = int(self.capabilities)
            slot.arg, slot.arg_len = self.arg_buffer, len(self.arg)
            slot.vars = native.ffi.NULL if self.vars.ptr is None else self.vars.ptr
            self._slot_template = slot
        return self._slot_template

    def _describe(self) -> str:
        return f"request for {self.controller.name or self.controller.sha256[:12]}"

    def spawn(self) -> "Sequence":
        """A new sequence running a fresh instance of the controller (its first call gets the
        prompt; a controller that exports `aicirt_prepare` starts from this argument's prepared
        template where the runtime keeps one: core/prepared.py). Raises ControllerError if the
        instance cannot be made; ValueError if the request or its runtime is closed."""
        from .sequence import Sequence
        self.check_open()
        self.runtime.check_open()
        seq = Sequence.instantiate(self)
        if self.controller.has_prepare:
            try:
                self.runtime.prepared.begin(seq)
            except BaseException:
                seq.close()
                raise
        self.sequences.append(seq)
        return seq

    def _adopt(self, forks: list["Sequence"]) -> None:
        self.sequences.extend(forks)
        self.forks += len(forks)

    @property
    def variables(self) -> dict[str, bytes]:
        """A snapshot of the variables."""
        return self.vars.snapshot()

    def var_get(self, name: str) -> bytes | None:
        return self.vars.get(name)

    def take_var_changes(self) -> list[tuple[int, str, str, bytes]]:
        """Variable changes since the last call: (seq_id, "set" | "append", name, value), at most
        one a name, in the order each name was first changed since the last call. Changes are
        coalesced (host.c): a set after anything is one "set" of the whole value, appends after
        appends one "append" of their concatenation; seq_id is the last sequence that changed it.
        Applied in order, they give the variables' values. Changes not taken cost no memory
        beyond the variables themselves (Limits.variable_bytes counts their native size)."""
        return self.vars.take_changes()

    def _release(self) -> None:
        for seq in self.sequences:
            seq.close()
        self.sequences.clear()
