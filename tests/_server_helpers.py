"""Helpers for the server tests: a live server per fixture, AICI-stream parsing and replay."""
from __future__ import annotations

import json
import time
from contextlib import contextmanager

import httpx


@contextmanager
def live_server(settings, backend=None, store=None):
    """A real server (uvicorn, 127.0.0.1, free port) on a thread; yields (url, Server)."""
    from aicirt.serve.app import create_app
    from aicirt.serve.background import serve_in_thread

    app = create_app(settings, backend=backend, store=store)
    with serve_in_thread(app) as url:
        yield url, app.state.server


def aici_lines(resp) -> list[str]:
    """The non-empty lines of a /v1/run stream, each checked the way AICI's client reads them:
    it raises on any line that is neither `data: {...}` nor `data: [DONE]`."""
    lines = [ln for ln in resp.iter_lines() if ln]
    for ln in lines:
        assert ln.startswith("data: {") or ln == "data: [DONE]", ln
    return lines


def aici_run(url: str, payload: dict, headers: dict | None = None) -> dict:
    """POST /v1/run as AICI's client does (JSON body, None fields dropped, streamed) and fold the
    stream as it does: texts and logs per fork index, storage (hex), last usage, errors."""
    body = {k: v for k, v in payload.items() if v is not None}
    out = {"objects": [], "texts": [""], "logs": [""], "storage": {}, "usage": {}, "errors": [], "finish": {}}
    with httpx.stream("POST", url + "/v1/run", json=body, headers=headers or {}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = aici_lines(r)
    assert lines[-1] == "data: [DONE]" and lines.count("data: [DONE]") == 1
    objs = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert objs[0]["object"] == "initial-run" and set(objs[0]) >= {"id", "created", "model"}
    for d in objs[1:]:
        assert d["object"] == "run"
        assert set(d["usage"]) == {"sampled_tokens", "ff_tokens", "cost"}
        out["usage"] = d["usage"]
        for ch in d["forks"]:
            assert isinstance(ch["logs"], str) and isinstance(ch["error"], str) and isinstance(ch["text"], str)
            assert isinstance(ch["micros"], int) and isinstance(ch["storage"], list)
            idx = ch["index"]
            while len(out["texts"]) <= idx:
                out["texts"].append("")
                out["logs"].append("")
            for s in ch["storage"]:
                w = s["WriteVar"]
                assert set(w) >= {"name", "value", "op"} and w["op"] in ("Set", "Append")
                prev = out["storage"].get(w["name"], "") if w["op"] == "Append" else ""
                out["storage"][w["name"]] = prev + w["value"]
            back = ch.get("backtrack", 0)
            text = out["texts"][idx]
            out["texts"][idx] = (text[:len(text) - back] if back else text) + ch["text"]
            out["logs"][idx] += ch["logs"]
            if ch["error"]:
                out["errors"].append(ch["error"])
            if "finish_reason" in ch:
                out["finish"][idx] = ch["finish_reason"]
    out["objects"] = objs
    out["storage"] = {k: bytes.fromhex(v).decode("utf-8", "replace") for k, v in out["storage"].items()}
    return out


def wait_until(pred, timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)
