"""The sandbox limits of docs/protocol.md#limits, in one settings object shared by the library and the CLI."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """Per-controller limits. Times in seconds, sizes in bytes. All validated on construction.

    A breach ends only the sequence concerned (finish reason ``error``), except the soft
    deadline, which makes the sequence no-op for the step and applies the late result next step.

    The two call limits count the CPU time of the thread running the call, checked at each epoch
    tick (docs/protocol.md#limits): a busy machine slows a call down but never spends its budget. A call starved of
    CPU still ends after `wall_backstop_factor` times its limit in wall-clock time. The soft
    deadline is wall-clock; the k-th late step in a row counts towards `max_late_steps` only once
    the call has used k soft deadlines of CPU time (waits for a core or for a turn never count).

    `memory_budget_bytes` bounds the memory of all live sequences together: each reserves its
    `memory_bytes` and `log_bytes`, and a new request's sequence past the budget is refused
    (`aicirt.core.memory.OverBudget`; a server keeps the request waiting or answers 503), never one
    that runs; 0 (the default) sizes it at 75% of the machine's memory (the cgroup's limit where
    smaller). A request's variables (at most `variable_bytes`) are not part of it.

    `resident_bytes` and `resident_idle_s` are not sandbox limits but the runtime's memory policy.
    With `resident_bytes` 0 (the default) a freed instance's linear memory goes back to the kernel
    at once (madvise), so the next instance's memory is unbacked until written: a fork then learns
    from /proc/self/pagemap exactly which pages its parent wrote and copies only those. With
    `resident_bytes` > 0 a freed pooled slot keeps up to min(1 MiB, resident_bytes) of its linear
    memory resident (zeroed, or reset to the module's image), so the next instance writes those
    pages without page faults, at the price of wasmtime resetting them at every free and a fork
    reading them all (which of them the parent wrote cannot be told); together freed slots keep at
    most `resident_bytes` (the slots freed longest ago give theirs back first), and all of it goes
    back once the runtime has made or freed no instance for `resident_idle_s` seconds, and the C
    heap's free pages with it (malloc_trim; with `resident_bytes` 0 too)
    (:class:`aicirt.core.memory.ResidentSlots`).

    `prepared_cache_bytes` bounds what a Runtime keeps of controllers' per-argument work (their
    `aicirt_prepare` export, docs/protocol.md#binary) to start later requests with the same
    argument from: the pages those templates hold beyond a fresh instance, counted in the memory
    budget; 0 keeps none (every request runs its prepare) (:mod:`aicirt.core.prepared`). A template
    is made at an argument's `prepared_after`-th request (2: an argument seen once makes none).
    """

    soft_deadline_s: float = 0.025      # after the forward pass ends (i.e. from BatchHandle.wait)
    max_late_steps: int = 10            # consecutive late steps before the sequence errors
    call_timeout_s: float = 1.0         # CPU time of one mid-process call (checked at each epoch tick)
    first_call_timeout_s: float = 1.0   # CPU time of the first call, which processes the prompt
    wall_backstop_factor: float = 10.0  # a call also ends after this many times its limit in wall-clock time
    memory_bytes: int = 64 << 20        # linear memory per instance
    stack_bytes: int = 512 << 10        # Wasm stack
    max_forks: int = 16                 # sequences a request may add by forking
    log_bytes: int = 64 << 10           # controller log kept per sequence (oldest dropped)
    host_arg_bytes: int = 1 << 20       # one host-import argument (text to tokenize, a variable value, a log line)
    variable_bytes: int = 16 << 20      # a request's variables, and its changes not yet taken
    upload_bytes: int = 64 << 20        # module size
    compile_timeout_s: float = 30.0
    epoch_tick_s: float = 0.01          # granularity of the hard time limit
    # workers started in place of ones stuck past half the soft deadline; the stuck ones take turns
    # (at most half the cores at once), so an extra worker costs a parked thread, not a core. Enough
    # for every stuck call to have its own (past it, stuck calls hold the base workers too)
    max_extra_workers: int = 512
    max_splices: int = 64               # splices in one branch of a result
    max_result_tokens: int = 1 << 16    # token ids in one result's splices (when-sampled + ff-tokens)
    resident_bytes: int = 0             # linear memory freed pooled slots keep resident for reuse (0: none)
    resident_idle_s: float = 1.0        # no instance made or freed this long: freed slots give it all back
    # what all live sequences of a runtime may reserve together (each memory_bytes + log_bytes);
    # 0: 75% of the machine's memory (aicirt.core.memory.MemoryBudget)
    memory_budget_bytes: int = 0
    # prepared templates (controllers that export aicirt_prepare) kept per Runtime, by the pages they hold
    # beyond a fresh instance: least recently used out first (0: none kept; core/prepared.py)
    prepared_cache_bytes: int = 64 << 20
    # an argument's template is made at its Nth request (the copy costs that request's first call
    # ~0.2 ms: the first sight of an argument that never comes back does not pay it; 1: at once)
    prepared_after: int = 2

    def __post_init__(self) -> None:
        for name in ("soft_deadline_s", "call_timeout_s", "first_call_timeout_s", "compile_timeout_s", "epoch_tick_s",
                     "resident_idle_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Limits.{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("max_late_steps", "prepared_after", "memory_bytes", "stack_bytes", "log_bytes", "upload_bytes", "host_arg_bytes",
                     "variable_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"Limits.{name} must be >= 1, got {getattr(self, name)!r}")
        for name in ("max_extra_workers", "max_splices", "max_result_tokens", "resident_bytes", "memory_budget_bytes",
                     "prepared_cache_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"Limits.{name} must be >= 0, got {getattr(self, name)!r}")
        if not self.wall_backstop_factor >= 1:
            raise ValueError(f"Limits.wall_backstop_factor must be >= 1, got {self.wall_backstop_factor!r}")
        if self.max_forks < 0:
            raise ValueError(f"Limits.max_forks must be >= 0, got {self.max_forks!r}")

    def ticks(self, seconds: float) -> int:
        """Epoch ticks for a time limit (at least one)."""
        return max(1, round(seconds / self.epoch_tick_s))
