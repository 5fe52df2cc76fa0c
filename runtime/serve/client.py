"""A client of `aicirt serve` (stdlib only: the CLI's `--server` mode needs no extra package).

`RemoteStore` has the methods of `store.Store` the CLI uses and returns the same types, so each
command prints the same output against a server as against the local store. `run_stream`
yields the parsed objects of a `/v1/run` stream.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from typing import Any

from .store import ModuleInfo, TagInfo, Upload, default_user, is_module_id


class ServerError(Exception):
    """The server answered with an error (`status`), or could not be reached (status 0)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def base_url(url: str) -> str:
    """`http://host:port` from any of `host:port`, `http://host:port/`, `http://host:port/v1/`."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


class Client:
    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 600.0):
        self.url = base_url(url)
        self.api_key = api_key
        self.timeout_s = timeout_s

    def _open(self, method: str, path: str, body: bytes | None = None,
              content_type: str | None = None) -> Any:
        headers = {"x-aicirt-user": default_user()}
        if self.api_key:
            headers["api-key"] = self.api_key
        if content_type:
            headers["content-type"] = content_type
        req = urllib.request.Request(self.url + path, data=body, method=method, headers=headers)
        try:
            return urllib.request.urlopen(req, timeout=self.timeout_s)
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                message = json.loads(raw)["message"]
            except (ValueError, KeyError, TypeError):
                message = raw.decode("utf-8", "replace").strip() or e.reason
            raise ServerError(e.code, message) from None  # as the local store words it
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ServerError(0, f"{self.url}: cannot reach the server ({reason})") from None

    def request(self, method: str, path: str, *, json_body: object = None, data: bytes | None = None) -> Any:
        ctype: str | None
        if json_body is not None:
            data, ctype = json.dumps(json_body).encode(), "application/json"
        else:
            ctype = "application/wasm" if data is not None else None
        with self._open(method, path, data, ctype) as resp:
            return json.loads(resp.read())

    def run_stream(self, payload: dict) -> Iterator[dict]:
        """POST /v1/run and yield each `data:` object (not the final `[DONE]`)."""
        with self._open("POST", "/v1/run", json.dumps(payload).encode(), "application/json") as resp:
            for raw in resp:
                line = raw.decode("utf-8").rstrip("\r\n")
                if not line:
                    continue
                if not line.startswith("data: "):
                    raise ServerError(200, f"unexpected line in the run stream: {line[:200]}")
                if line == "data: [DONE]":
                    return
                yield json.loads(line[6:])


class RemoteStore:
    """The store of a running server, with `Store`'s interface."""

    def __init__(self, client: Client):
        self.client = client
        self.root = client.url

    def put(self, data: bytes, *, tags: Iterable[str] = (), user: str | None = None) -> Upload:
        d = self.client.request("POST", "/v1/controllers", data=bytes(data))
        infos = self.tag(d["module_id"], tags) if tags else []
        return Upload(d["module_id"], d["wasm_size"], d["compiled_size"], d.get("time", 0), tuple(infos))

    def tag(self, module_id: str, tags: Iterable[str], *, user: str | None = None) -> list[TagInfo]:
        d = self.client.request("POST", "/v1/controllers/tags", json_body={"module_id": module_id,
                                                                            "tags": list(tags)})
        return [TagInfo(**t) for t in d["tags"]]

    def tags(self) -> list[TagInfo]:
        return [TagInfo(**t) for t in self.client.request("GET", "/v1/controllers/tags")["tags"]]

    def modules(self) -> list[ModuleInfo]:
        out = []
        for m in self.client.request("GET", "/v1/controllers")["modules"]:
            out.append(ModuleInfo(**{**m, "tags": tuple(m["tags"])}))
        return out

    def remove(self, name: str) -> ModuleInfo | TagInfo:
        gone = self.client.request("DELETE", f"/v1/controllers/{urllib.parse.quote(name, safe='')}")["removed"]
        if is_module_id(name):
            return ModuleInfo(**{**gone, "tags": tuple(gone["tags"])})
        return TagInfo(**gone)
