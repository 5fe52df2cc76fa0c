"""Every request gets an answer: hostile controllers (tests/hostile/) uploaded and run through
`aicirt serve` all at once, beside healthy requests. Each hostile request ends with its error (a
400 when its controller fails on its first call, else a stream whose fork says why), and the
healthy outputs are what they are alone.

The engine loop once lost a job whenever another job was rejected in the same step (it removed
the rejected one from the list it was iterating), so a request finishing in that step was retired
by the engine unheard and its client waited forever: one or two of ten hostile requests, a
different one each run. The timeout below is generous (no timing promise); a lost request is one
that never answers at all."""
from __future__ import annotations

import concurrent.futures as cf
import json

import httpx
import pytest
from _server_helpers import aici_run, live_server
from hostile.kinds import ALL, HERE, KINDS

from aicirt.build import toolchain
from aicirt.engine.backends import load_backend
from aicirt.serve.settings import Settings

pytest.importorskip("fastapi")

ANSWER_TIMEOUT_S = 120


def _hostile_kinds() -> list:
    """Kinds whose controller must end in error under the server's limits (the defaults) and
    capabilities (all), one request each."""
    return [k for k in KINDS if k.expect.startswith("error: ") and not k.limits and not k.xfail
            and k.capabilities == ALL and k.take_var_changes and k.copies == 1 and not k.respawn]


def _healthy(k: int) -> dict:
    if k % 3 == 0:
        return {"controller": "regex", "controller_arg": f"[a-z]{{{8 + k}}}", "prompt": f"Healthy {k}: ",
                "max_tokens": 30}
    if k % 3 == 1:
        return {"controller": "yesno", "prompt": f"Healthy {k}? "}
    return {"controller": "choice", "controller_arg": "red\ngreen", "prompt": f"Healthy {k}: "}


def _hostile_answer(url: str, body: dict) -> tuple[int, str]:
    """(status, the error the client reads): a 4xx's message, or the stream's fork errors."""
    with httpx.stream("POST", url + "/v1/run", json=body, timeout=ANSWER_TIMEOUT_S) as r:
        raw = r.read().decode()
    if r.status_code != 200:
        return r.status_code, json.loads(raw)["message"]
    lines = [ln for ln in raw.splitlines() if ln]
    assert lines[-1] == "data: [DONE]", raw[-300:]
    errors = [f["error"] for ln in lines[1:-1] for f in json.loads(ln[6:])["forks"] if f["error"]]
    return 200, "; ".join(errors)


def test_many_hostile_and_healthy_requests_at_once_each_get_their_answer(tmp_path):
    kinds = _hostile_kinds()
    assert len(kinds) >= 10
    c_wasm = toolchain.build_cached(HERE / "hostile.c").read_bytes()
    settings = Settings(store=str(tmp_path), max_context=512, max_batch=64, max_queue=64)
    with live_server(settings, backend=load_backend("scripted", forward_delay_s=0.001)) as (url, _):
        bodies = []
        for k in kinds:
            data = bytes(k.wasm) if k.wasm is not None else c_wasm
            r = httpx.post(url + "/v1/controllers", content=data, timeout=ANSWER_TIMEOUT_S)
            assert r.status_code == 200, (k.name, r.text)
            bodies.append((k, {"controller": r.json()["module_id"], "controller_arg": k.arg.decode(),
                               "prompt": "x y", "max_tokens": 30}))
        healthy = [_healthy(k) for k in range(12)]
        alone = [aici_run(url, b)["texts"] for b in healthy]
        for _ in range(2):             # the lost answer depended on which jobs shared a step
            with cf.ThreadPoolExecutor(len(bodies) + len(healthy)) as pool:
                bad = [(k, pool.submit(_hostile_answer, url, b)) for k, b in bodies]
                good = [pool.submit(aici_run, url, b) for b in healthy]
                for k, f in bad:
                    status, error = f.result(timeout=ANSWER_TIMEOUT_S)
                    needles = k.expect[len("error: "):].split("|")
                    assert status in (200, 400) and any(n in error for n in needles), (k.name, status, error)
                assert [f.result(timeout=ANSWER_TIMEOUT_S)["texts"] for f in good] == alone
