"""Counters, gauges and summaries for `GET /metrics`, in Prometheus' text format (version 0.0.4).

Hand-written (a few dozen lines) rather than a dependency: the server needs only counters,
gauges and sum/count summaries. Thread-safe: the engine thread and HTTP handlers both write.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

#: name -> (type, help). A name not listed here is a programming error (KeyError).
DESCRIPTIONS = {
    "aicirt_requests_total": ("counter", "Generation requests by outcome (ok, rejected, cancelled, failed)."),
    "aicirt_rejected_total": ("counter", "Requests refused by admission control (503)."),
    "aicirt_http_responses_total": ("counter", "HTTP responses by route and status code."),
    "aicirt_tokens_total": ("counter", "Tokens of finished requests: sampled, or ff (prompt and fast-forwarded)."),
    "aicirt_sequence_errors_total": ("counter", "Sequences that ended with an error (controller or sampling)."),
    "aicirt_engine_errors_total": ("counter", "Engine steps that raised (their requests failed)."),
    "aicirt_uploads_total": ("counter", "Controller uploads by outcome."),
    "aicirt_step_seconds": ("summary", "Wall time of one engine step."),
    "aicirt_queue_wait_seconds": ("summary", "Time from admission to joining the running batch."),
    "aicirt_controller_seconds_total": ("counter", "Controller time summed over sequences (worker threads)."),
    "aicirt_forward_seconds_total": ("counter", "Engine time in the model's forward pass."),
    "aicirt_queue_depth": ("gauge", "Requests admitted and waiting to join the batch."),
    "aicirt_running_requests": ("gauge", "Requests in the running batch."),
    "aicirt_live_sequences": ("gauge", "Sequences the engine is decoding."),
    "aicirt_worker_pool_saturated": ("gauge", "1 while stalled controller calls hold every extra worker "
                                              "(Limits.max_extra_workers): a further stuck call delays healthy ones."),
    "aicirt_worker_stalls_total": ("counter", "Controller calls ever stalled: ones that used half the soft deadline "
                                              "in CPU time, and from then on take turns with other stuck calls."),
    "aicirt_memory_budget_bytes": ("gauge", "What all live sequences may reserve together (Limits.memory_budget_bytes)."),
    "aicirt_memory_reserved_bytes": ("gauge", "What live sequences reserve now (each Limits.memory_bytes + log_bytes); "
                                              "new requests wait while a sequence more would not fit."),
    "aicirt_resident_slot_bytes": ("gauge", "Linear memory freed pooled slots keep resident for reuse "
                                            "(at most Limits.resident_bytes; all given back after Limits.resident_idle_s idle)."),
}


def _known(name: str) -> None:
    if name not in DESCRIPTIONS:
        raise KeyError(f"metric {name} is not described in DESCRIPTIONS")


def _key(labels: dict) -> tuple:
    return tuple(sorted(labels.items()))


def _fmt_labels(key: tuple) -> str:
    if not key:
        return ""
    body = ",".join(f'{k}="{str(v)}"'.replace("\n", " ") for k, v in key)
    return "{" + body + "}"


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, dict[tuple, float]] = {}
        self._summaries: dict[str, dict[tuple, list[float]]] = {}
        self._gauges: dict[str, Callable[[], float]] = {}

    def inc(self, name: str, amount: float = 1, **labels: object) -> None:
        _known(name)
        with self._lock:
            series = self._values.setdefault(name, {})
            series[_key(labels)] = series.get(_key(labels), 0) + amount

    def set(self, name: str, value: float, **labels: object) -> None:
        _known(name)
        with self._lock:
            self._values.setdefault(name, {})[_key(labels)] = value

    def observe(self, name: str, value: float, **labels: object) -> None:
        _known(name)
        with self._lock:
            s = self._summaries.setdefault(name, {}).setdefault(_key(labels), [0.0, 0])
            s[0] += value
            s[1] += 1

    def gauge(self, name: str, read: Callable[[], float]) -> None:
        """A gauge read when scraped (queue depth, live sequences)."""
        _known(name)
        self._gauges[name] = read

    def value(self, name: str, **labels: object) -> float:
        with self._lock:
            return self._values.get(name, {}).get(_key(labels), 0)

    def render(self) -> str:
        lines = []
        with self._lock:
            values = {k: dict(v) for k, v in self._values.items()}
            summaries = {k: {lk: list(s) for lk, s in v.items()} for k, v in self._summaries.items()}
        for name, (kind, help_) in DESCRIPTIONS.items():
            lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
            if name in self._gauges:
                lines.append(f"{name} {float(self._gauges[name]())}")
            for key, v in values.get(name, {}).items():
                lines.append(f"{name}{_fmt_labels(key)} {float(v)}")
            for key, (total, count) in summaries.get(name, {}).items():
                lines.append(f"{name}_sum{_fmt_labels(key)} {total}")
                lines.append(f"{name}_count{_fmt_labels(key)} {count}")
        return "\n".join(lines) + "\n"
