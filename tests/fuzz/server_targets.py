"""Fuzz targets for the server's request parsing: `aicirt serve`'s app on the scripted model, driven
in-process through Starlette's TestClient (lifespan, engine loop and store as in production).
Whatever a request's route, body, headers (API key, Content-Length, user) and query string, the
answer is a well-formed success or a 4xx whose JSON body names the problem: never a 500, never an
exception out of the app; and the next well-formed requests get exactly what they got before.
Used by tests/test_server_fuzz.py (Hypothesis) and tests/fuzz/fuzz_parsers.py (atheris: `server`).
"""
from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from urllib.parse import quote

from fastapi.testclient import TestClient
from hostile.wat import module

from aicirt.engine.backends import load_backend
from aicirt.serve.app import create_app     # imported here so that atheris instruments the server
from aicirt.serve.settings import Settings

KEY = "k3y"
#: (method, path): the DELETE path takes a name after it.
ROUTES = (("POST", "/v1/run"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
          ("POST", "/v1/controllers/tags"), ("POST", "/v1/controllers"), ("DELETE", "/v1/controllers/"),
          ("GET", "/v1/controllers/tags"), ("GET", "/v1/controllers"), ("GET", "/v1/models"),
          ("GET", "/metrics"), ("GET", "/health"))
#: The well-formed requests replayed after fuzzed ones: no controller, and a shipped one.
HEALTHY = (("/v1/completions", {"prompt": "Say: ", "max_tokens": 4, "temperature": 0}),
           ("/v1/completions", {"prompt": "Year: ", "max_tokens": 4, "temperature": 0, "controller": "regex",
                                "controller_arg": "[0-9]{4}"}))
_state: dict = {}


def client():
    """The TestClient (started once per process, closed at exit) over a keyed server."""
    if not _state:
        root = tempfile.mkdtemp(prefix="aicirt-fuzz-store-")
        settings = Settings(store=root, max_context=256, max_upload_bytes=64 << 10, max_batch=16, max_queue=16,
                            api_key=KEY, default_max_tokens=16)
        c = TestClient(create_app(settings, backend=load_backend("scripted")), raise_server_exceptions=False)
        c.__enter__()
        _state.update(client=c, root=root)
        atexit.register(close)
        up = c.post("/v1/controllers", content=bytes(module()), headers={"api-key": KEY})
        assert up.status_code == 200, up.text
        _state["module_id"] = up.json()["module_id"]
        _state["healthy"] = [_healthy(c, path, body) for path, body in HEALTHY]
    return _state["client"]


def close() -> None:
    c = _state.pop("client", None)
    if c is not None:
        c.__exit__(None, None, None)
        shutil.rmtree(_state.pop("root"), ignore_errors=True)
    _state.clear()


def module_id() -> str:
    client()
    return _state["module_id"]


def _healthy(c, path: str, body: dict) -> str:
    r = c.post(path, json=body, headers={"api-key": KEY})
    assert r.status_code == 200, f"a well-formed request failed: {r.status_code} {r.text[:300]}"
    return r.json()["choices"][0]["text"]


def check_healthy() -> None:
    """The well-formed requests still get what they got on a fresh server."""
    c = client()
    for (path, body), want in zip(HEALTHY, _state["healthy"]):
        got = _healthy(c, path, body)
        assert got == want, f"a well-formed request was harmed: {got!r}, alone {want!r}"


def request(method: str, path: str, body: bytes = b"", headers: dict | None = None, query: str = ""):
    """One request with the right key unless `headers` says otherwise; checks the answer."""
    heads = {b"api-key": KEY.encode()} if headers is None else headers
    url = path + (f"?{query}" if query else "")
    r = client().request(method, url, content=body, headers=heads)
    check_response(r, f"{method} {url[:80]} {body[:80]!r}")
    return r


def check_response(r, what: str) -> None:
    status = r.status_code
    assert status < 500, f"{what}: {status} {r.text[:400]}"
    ctype = r.headers.get("content-type", "")
    if status >= 400:
        assert ctype.startswith("application/json"), f"{what}: {status} error not JSON: {r.text[:200]}"
        err = r.json()
        assert isinstance(err.get("message"), str) and err["message"].strip(), f"{what}: error says nothing: {err}"
        assert err["error"] == {"message": err["message"], "type": "invalid_request_error", "code": status}, err
        return
    assert status == 200, f"{what}: {status}"
    if ctype.startswith("text/event-stream"):
        lines = [ln for ln in r.text.split("\n") if ln]
        assert lines and lines[-1] == "data: [DONE]" and lines.count("data: [DONE]") == 1, f"{what}: {lines[-3:]}"
        for ln in lines[:-1]:
            assert ln.startswith("data: {"), f"{what}: {ln[:200]}"
            event = json.loads(ln[6:])
            code = event.get("error", {}).get("code", 200) if isinstance(event.get("error"), dict) else 200
            assert code < 500, f"{what}: a stream ended with {event}"
    elif ctype.startswith("application/json"):
        assert isinstance(r.json(), dict)
    else:
        assert ctype.startswith("text/plain"), f"{what}: {ctype}"


def raw_request(data: bytes) -> None:
    """For atheris. data[0]: the route; data[1]: the key (in `api-key`, as a bearer token, absent,
    or the next data[2] bytes as given); then the body (for DELETE: the name, percent-encoded);
    a query string after the first 0xFF byte. Every 16th input also replays the healthy requests."""
    if len(data) < 2:
        return
    method, path = ROUTES[data[0] % len(ROUTES)]
    mode, rest = data[1] % 4, data[2:]
    headers: dict = {b"api-key": KEY.encode()}
    if mode == 1:
        headers = {b"authorization": b"Bearer " + KEY.encode()}
    elif mode == 2:
        headers = {}
    elif mode == 3 and rest:
        n, rest = rest[0] % 16, rest[1:]
        headers = {b"api-key": bytes(b for b in rest[:n] if b >= 0x20 and b != 0x7F)}
        rest = rest[n:]
    body, _, query = rest.partition(b"\xff")
    if method == "DELETE":
        path, body = path + quote(body, safe=""), b""
    request(method, path, body, headers, quote(query, safe="=&"))
    if data[0] % 16 == 0:
        check_healthy()
