"""Run hostile sequences in one batch beside healthy ones, through aicirt.testing's legal engine
with all-zero choices (always the lowest allowed token, no engine backtracks, no late steps),
so a healthy sequence's output is a pure function of its controller and prompt: whatever runs
beside it must not change it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from scripted import branch, result, script, splice

from aicirt import Capabilities

from aicirt.build import toolchain
from aicirt.testing import Choices, EngineSettings, FuzzEngine


@dataclass(frozen=True)
class Spec:
    wasm: object                    # path or bytes
    arg: bytes = b""
    prompt: tuple[int, ...] = (1, 2)
    capabilities: Capabilities = Capabilities.ALL


@dataclass
class Outcome:
    healthy: dict[str, tuple]                       # label -> (tokens, finish reason, error)
    hostile: list[tuple[str | None, str | None]]    # (finish reason or None if still live, error)
    steps: int
    elapsed_s: float                # wall-clock, for messages only (a busy machine stretches it)
    worst_step_s: float
    cpu_s: float = 0.0              # this process's CPU time (all threads) over the same span
    stuck_at_healthy_end: int = 0   # hostile sequences whose call was still out when the healthy finished
    load_error: str | None = None
    logs: list[str] = field(default_factory=list)


def healthy_specs(scripted_wasm) -> list[Spec]:
    """A regex controller, and a scripted one that forks, splices conditionally and backtracks."""
    forking = script(result(branch(mask=[65, 66]), branch(mask=[67], splices=[splice(when=[67], ff=[68, 69])])),
                     result(branch(mask=list(range(40, 60)), splices=[splice(when=[40], backtrack=1, ff=[70, 71])])))
    return [Spec(toolchain.build_cached("regex"), b"[0-9]{2}-[a-c]{2,3}"),
            Spec(scripted_wasm, forking, prompt=(5, 6, 7))]


def run_batch(rt, healthy: list[Spec], hostile: Spec | None = None, *, copies: int = 1, respawn: int = 0,
              max_steps: int = 300, max_tokens: int = 8, wait_hostile: bool = False,
              take_var_changes: bool = True, settle: bool = False, settle_s: float = 60.0) -> Outcome:
    """Healthy sequences labelled h0, h1, ... (forks h1.1, ...), hostile ones x0, x1, ...; runs
    until every healthy sequence has finished (`wait_hostile`: every sequence), at most
    `max_steps` steps; `settle`: then on until the hostile ones end too (at their hard limits,
    CPU time: on a busy machine much later in wall-clock time), for at most `settle_s` seconds
    of wall-clock time (a hang guard), `elapsed_s` still timing the healthy. `respawn`: a new
    hostile request every step, up to this many."""
    settings = EngineSettings(max_tokens=max_tokens, take_var_changes=take_var_changes)
    engine = FuzzEngine(rt, lambda label: Choices(replay=[]), Choices(replay=[]), settings)
    ctrls: dict[int, object] = {}

    def add(spec: Spec, label: str):
        key = id(spec.wasm)
        if key not in ctrls:
            ctrls[key] = rt.load(spec.wasm)
        engine.add(rt.new_request(ctrls[key], spec.arg, spec.capabilities), list(spec.prompt), label)

    t0, c0 = time.perf_counter(), time.process_time()   # spawning counts: a hostile `_initialize` must not hold anyone up
    for i, spec in enumerate(healthy):
        add(spec, f"h{i}")
    n_hostile = 0
    if hostile is not None:
        for _ in range(copies):
            add(hostile, f"x{n_hostile}")
            n_hostile += 1
    worst = 0.0
    elapsed = cpu = None
    stuck = 0

    def live(prefixes: tuple[str, ...]) -> bool:
        return any(t.label.startswith(prefixes) and not t.finished for t in engine.tracks)

    try:
        timed = ("h", "x") if wait_hostile else ("h",)
        waited = ("h", "x") if settle else timed
        settle_t0 = None
        while live(waited):
            if elapsed is None and engine.steps >= max_steps:
                break
            if elapsed is not None:   # settling
                settle_t0 = settle_t0 or time.monotonic()
                if time.monotonic() - settle_t0 > settle_s:
                    break
            s0 = time.perf_counter()
            engine.step()
            worst = max(worst, time.perf_counter() - s0)
            if hostile is not None and n_hostile < respawn:
                add(hostile, f"x{n_hostile}")
                n_hostile += 1
            if elapsed is None and not live(timed):
                elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
                stuck = sum(1 for t in engine.tracks
                            if t.label.startswith("x") and not t.finished and t.seq is not None and t.seq.call_out)
        if elapsed is None:
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        engine.close()
    return Outcome({t.label: (tuple(t.tokens), t.finish_reason, t.error) for t in engine.tracks if t.label.startswith("h")},
                   [(t.finish_reason, t.error) for t in engine.tracks if t.label.startswith("x")],
                   engine.steps, elapsed, worst, cpu, stuck, logs=[t.logs for t in engine.tracks if t.label.startswith("x")])
