"""Data parallelism for `aicirt serve --engine vllm --data-parallel-size N`: N ranks behind one server.

Each rank is a whole `aicirt serve --engine vllm` in a process of its own (one in-process vLLM
`EngineCore`, its own runtime and controllers, beside its logits), listening on a loopback port.
The front server, on the port the user named, routes every generation request to the rank with
the fewest requests in flight (ties: the lowest rank) and streams the rank's answer back byte for
byte, so routes, stream format, errors and status codes are the ranks' own: those of one server.
A request lives on one rank with all its forks (they share that rank's prefix cache). Everything
else (uploads, tags, `/v1/config`, `/v1/models`) goes to rank 0: the ranks share one controller
store folder, content-addressed, so an upload through rank 0 is seen by every rank at once.
`GET /metrics` is every rank's metrics with a `rank` label, plus the front's own
(`aicirt_dp_requests_total`, `aicirt_dp_in_flight`); `GET /health` is every rank's. Each response
of a routed request names its rank in an `x-aicirt-rank` header.

Why not vLLM's own data parallelism (`vllm/v1/engine/core.py`, `core_client.py`): for a dense
model vLLM's DP ranks are independent engine-core processes ("Non-MoE DP ranks are completely
independent, so treat like DP=1"), and its client routes each request to the least-loaded one
(`DPLBAsyncMPClient.get_core_engine_for_request`). That is this design, with aicirt's step, which
vLLM's engine-core processes cannot run (their outputs carry tokens, not forks and splices),
inside each rank. MoE models with expert parallelism need vLLM's lock-stepped `DPEngineCoreProc`,
which this engine does not support.

The front server itself is `aicirt.integrations.vllm_dp_app` (FastAPI); this module has the ranks.

Cores and devices: rank i gets its share of this process's CPUs as `VLLM_CPU_OMP_THREADS_BIND`
(split again per tensor-parallel rank with `|`) unless `AICIRT_VLLM_DP_BIND` gives the binds,
one per rank separated by `;` (e.g. `0;1`, `0-3|4-7;8-11|12-15`); with `CUDA_VISIBLE_DEVICES`
set, rank i sees devices i*TP .. i*TP+TP-1 of that list.
"""
from __future__ import annotations

import dataclasses
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..serve.settings import Settings

_CHILD = "import pickle, sys; from aicirt.integrations.vllm_dp import _rank_main; _rank_main(*pickle.load(sys.stdin.buffer))"


def rank_binds(ranks: int, tp: int, cpus: list[int] | None = None) -> list[str]:
    """`VLLM_CPU_OMP_THREADS_BIND` for each of `ranks` ranks of `tp` tensor-parallel workers:
    `AICIRT_VLLM_DP_BIND` split on `;` where set, else `cpus` (default: this process's) cut into
    equal consecutive shares. Raises `ValueError` for too few CPUs or binds."""
    given = os.environ.get("AICIRT_VLLM_DP_BIND")
    if given:
        binds = [b.strip() for b in given.split(";")]
        if len(binds) != ranks or not all(binds):
            raise ValueError(f"AICIRT_VLLM_DP_BIND={given!r}: want {ranks} binds separated by ';'")
        return binds
    cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    per = len(cpus) // (ranks * tp)
    if per < 1:
        raise ValueError(f"data_parallel_size {ranks} x tensor_parallel_size {tp} needs {ranks * tp} CPUs, "
                         f"this process has {len(cpus)} (or set AICIRT_VLLM_DP_BIND)")

    def span(i: int) -> str:
        a, b = cpus[i * per], cpus[i * per + per - 1]
        return str(a) if per == 1 else f"{a}-{b}" if b - a == per - 1 else ",".join(map(str, cpus[i * per:i * per + per]))

    return ["|".join(span(r * tp + t) for t in range(tp)) for r in range(ranks)]


def rank_env(rank: int, ranks: int, tp: int, bind: str) -> dict[str, str]:
    """The environment of rank `rank`'s process: its CPU bind and, where `CUDA_VISIBLE_DEVICES`
    lists devices, its share of them."""
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=bind, AICIRT_VLLM_DP_RANK=str(rank))
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    devices = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if devices:
        if len(devices) < ranks * tp:
            raise ValueError(f"CUDA_VISIBLE_DEVICES lists {len(devices)} devices; {ranks} ranks x TP {tp} need "
                             f"{ranks * tp}")
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices[rank * tp:rank * tp + tp])
    return env


def _listener() -> socket.socket:
    """A listening loopback socket on a free port, for a rank to inherit: bound here, so no
    other process can take the port between choosing and serving it."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1024)
    return s


def _rank_main(settings: Settings, fd: int) -> None:
    """A rank's process: `aicirt serve` with `settings` on the inherited listening socket `fd`,
    until SIGTERM or SIGINT (uvicorn ends it gracefully; the engine closes with the app)."""
    import uvicorn

    from ..serve.app import create_app

    sys.stderr.write(f"aicirt serve: rank {os.environ.get('AICIRT_VLLM_DP_RANK')}: loading {settings.served_model} ...\n")
    app = create_app(settings)
    uvicorn.run(app, fd=fd, log_level="warning", timeout_graceful_shutdown=5)


class Ranks:
    """The ranks' processes: started by `start`, routed by `pick`/`done`, ended by `close`."""

    def __init__(self, settings: Settings) -> None:
        n, tp = settings.data_parallel_size, settings.tensor_parallel_size
        binds = rank_binds(n, tp)
        self.settings = settings
        self.urls: list[str] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.in_flight = [0] * n
        self.routed = [0] * n
        self._envs = [rank_env(i, n, tp, binds[i]) for i in range(n)]

    def start(self, timeout_s: float = 900.0) -> None:
        """Start every rank at once and wait until each answers `/health`. Raises `RuntimeError`
        naming a rank that exited or did not come up in `timeout_s` (the others are ended)."""
        import httpx

        try:
            for i, env in enumerate(self._envs):
                with _listener() as sock:
                    port = int(sock.getsockname()[1])
                    child = dataclasses.replace(self.settings, host="127.0.0.1", port=port, data_parallel_size=1,
                                                allow_remote=False)
                    p = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, env=env,
                                         pass_fds=[sock.fileno()])
                    assert p.stdin is not None
                    p.stdin.write(pickle.dumps((child, sock.fileno())))
                    p.stdin.close()
                self.procs.append(p)
                self.urls.append(f"http://127.0.0.1:{port}")
            deadline = time.monotonic() + timeout_s
            waiting = set(range(len(self.procs)))
            while waiting:
                for i in sorted(waiting):
                    if self.procs[i].poll() is not None:
                        raise RuntimeError(f"data-parallel rank {i} exited with status {self.procs[i].returncode} "
                                           "while starting (its log is above)")
                    try:
                        if httpx.get(self.urls[i] + "/health", timeout=5).status_code == 200:
                            waiting.discard(i)
                    except httpx.TransportError:
                        pass
                if waiting and time.monotonic() > deadline:
                    raise RuntimeError(f"data-parallel ranks {sorted(waiting)} did not start in {timeout_s:.0f} s")
                if waiting:
                    time.sleep(0.5)
        except BaseException:
            self.close()
            raise

    def pick(self) -> int:
        """The rank for a new request: fewest in flight, then fewest routed so far, then lowest."""
        i = min(range(len(self.urls)), key=lambda r: (self.in_flight[r], self.routed[r], r))
        self.in_flight[i] += 1
        self.routed[i] += 1
        return i

    def done(self, rank: int) -> None:
        self.in_flight[rank] -= 1

    def close(self) -> None:
        """End every rank (SIGTERM, then SIGKILL after 15 s). Idempotent."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def merge_metrics(texts: list[str], front: dict[str, tuple[str, str, dict[int, float]]]) -> str:
    """The ranks' Prometheus texts as one, each sample labelled with its rank, each metric's
    HELP and TYPE once (samples of a metric stay together), then the front's own metrics
    (name -> (type, help, {rank: value}))."""
    order: list[str] = []
    heads: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    for rank, text in enumerate(texts):
        name = ""
        for line in text.splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                name = line.split(" ", 3)[2]
                if name not in heads:
                    order.append(name)
                    heads[name], samples[name] = [], []
                if rank == 0 or len(heads[name]) < 2:
                    if line not in heads[name]:
                        heads[name].append(line)
                continue
            if not line.strip() or line.startswith("#"):
                continue
            series, _, value = line.rpartition(" ")
            if "{" in series:
                series = series.replace("{", f'{{rank="{rank}",', 1)
            else:
                series = f'{series}{{rank="{rank}"}}'
            samples.setdefault(name or series.split("{")[0], []).append(f"{series} {value}")
            if not name:
                order.append(series.split("{")[0])
                heads.setdefault(series.split("{")[0], [])
    lines = []
    for name in order:
        lines += heads.get(name, []) + samples.get(name, [])
    for name, (kind, help_, values) in front.items():
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
        lines += [f'{name}{{rank="{r}"}} {float(v)}' for r, v in sorted(values.items())]
    return "\n".join(lines) + "\n"
