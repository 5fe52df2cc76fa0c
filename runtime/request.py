"""A request: one controller, its argument and capabilities, and the variables all its forks share."""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from .capabilities import Capabilities

if TYPE_CHECKING:
    from .controller import Controller
    from .runtime import Runtime
    from .sequence import Sequence


class Request:
    """Created by :meth:`Runtime.new_request`. Thread-safe: controllers of several forks may set
    variables from different worker threads at once."""

    def __init__(self, runtime: "Runtime", controller: "Controller", arg: bytes, capabilities: Capabilities):
        self.runtime = runtime
        self.controller = controller
        self.arg = bytes(arg)
        self.capabilities = Capabilities(capabilities)
        self.variables: dict[str, bytes] = {}
        self.sequences: list["Sequence"] = []
        self.forks = 0
        self._changes: list[tuple[int, str, str, bytes]] = []
        self._held = self._pending = 0         # bytes in variables / in changes not yet taken
        self._lock = threading.Lock()

    def spawn(self) -> "Sequence":
        """A new sequence running a fresh instance of the controller (its first call gets the prompt)."""
        from .sequence import Sequence
        seq = Sequence.instantiate(self)
        self.sequences.append(seq)
        return seq

    def var_get(self, name: str) -> bytes | None:
        with self._lock:
            return self.variables.get(name)

    def var_set(self, seq_id: int, name: str, value: bytes, append: bool) -> None:
        """Set or append; raises ValueError past Limits.variable_bytes (held values, or changes
        the embedder has not taken yet), which ends the calling sequence."""
        with self._lock:
            old = self.variables.get(name)
            new = (old or b"") + value if append else value
            held = self._held - (len(name) + len(old) if old is not None else 0) + len(name) + len(new)
            pending = self._pending + len(name) + len(value)
            cap = self.runtime.limits.variable_bytes
            if held > cap or pending > cap:
                raise ValueError(f"variables would take {max(held, pending)} bytes, over the limit of {cap} "
                                 f"(Limits.variable_bytes)")
            self.variables[name] = new
            self._held, self._pending = held, pending
            self._changes.append((seq_id, "append" if append else "set", name, value))

    def take_var_changes(self) -> list[tuple[int, str, str, bytes]]:
        """Variable changes since the last call: (seq_id, "set" | "append", name, value), in order."""
        with self._lock:
            out, self._changes, self._pending = self._changes, [], 0
            return out

    def close(self) -> None:
        for seq in self.sequences:
            seq.close()
        self.sequences.clear()
