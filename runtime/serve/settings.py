"""One settings schema for `aicirt serve`: the CLI's flags, the environment, tests and benchmarks.

`Settings` is plain data validated at construction (`ValueError` naming the field), so the
server never starts half-configured. No web framework is imported here.
"""
from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, fields
from typing import Any

#: Environment variables read by `Settings.from_env` (the CLI's flags win over them).
ENV = {"api_key": "AICIRT_API_KEY", "store": "AICIRT_STORE", "model": "AICIRT_MODEL"}


@dataclass(frozen=True)
class Settings:
    """What the server needs to start.

    `host`/`port`: where to listen; a non-loopback `host` needs `api_key` or `allow_remote`.
    `model`: as `aicirt run --model` takes it (None: the default SmolLM2). `api_key`: required in
    an `api-key` header or `Authorization: Bearer` on every route but `/health`, when set.
    `store`: the controller store's root (None: `AICIRT_STORE` or the user's data directory).
    `max_batch`: requests decoding at once (one engine step serves them all); `max_queue`:
    requests waiting beyond those; a request past both gets 503 with `Retry-After`.
    `max_context`: prompt + generated tokens a sequence may hold (None: the model's own limit,
    4096 where the model has none). `default_max_tokens`: when a request gives none.
    `max_upload_bytes`: body limit of `POST /v1/controllers`. `workers`: controller threads.
    `model_name`: the id `/v1/models` reports (None: derived from `model`).
    """

    host: str = "127.0.0.1"
    port: int = 4242
    model: str | None = None
    api_key: str | None = None
    allow_remote: bool = False
    store: str | None = None
    max_batch: int = 64
    max_queue: int = 256
    max_context: int | None = None
    default_max_tokens: int = 256
    max_upload_bytes: int = 64 << 20
    workers: int = 2
    model_name: str | None = None
    retry_after_s: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        for name in ("max_batch", "default_max_tokens", "max_upload_bytes", "workers", "retry_after_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        if self.max_context is not None and self.max_context < 2:
            raise ValueError(f"max_context must be >= 2, got {self.max_context}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty (leave it unset for none)")
        if not self.api_key and not self.allow_remote and not is_loopback(self.host):
            raise ValueError(f"refusing to listen on {self.host} without an API key: give --api-key "
                             f"(or {ENV['api_key']}), or --allow-remote to serve anyone who can reach it")

    @classmethod
    def from_env(cls, **given: Any) -> Settings:
        """Settings from keyword arguments, the `ENV` variables filling those given as None."""
        for name, var in ENV.items():
            if given.get(name) is None and os.environ.get(var):
                given[name] = os.environ[var]
        known = {f.name for f in fields(cls)}
        unknown = set(given) - known
        if unknown:
            raise ValueError(f"unknown settings: {', '.join(sorted(unknown))}")
        return cls(**{k: v for k, v in given.items() if v is not None})

    @property
    def served_model(self) -> str:
        return self.model_name or (self.model or "smollm2")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
