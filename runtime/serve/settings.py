"""One settings schema for `aicirt serve`: the CLI's flags, a config file, the environment, tests
and benchmarks, and what `GET /v1/config` reports.

`Settings` is plain data validated at construction (`ValueError` naming the field), so the
server never starts half-configured; its `limits` are the controllers' sandbox limits
(`aicirt.Limits`, which validates itself). `Settings.load` merges the sources, each value checked
against the field's type: flags > environment > config file > defaults. No web framework is
imported here.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import ipaddress
import json
import os
import sys
import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from aicirt.limits import Limits

#: Environment variables read by `Settings.load` and `Settings.from_env` (flags win over them).
ENV = {"api_key": "AICIRT_API_KEY", "store": "AICIRT_STORE", "model": "AICIRT_MODEL"}


@dataclass(frozen=True)
class Settings:
    """What the server needs to start.

    `host`/`port`: where to listen; a non-loopback `host` needs `api_key` or `allow_remote`.
    `model`: as `aicirt run --model` takes it (None: the default SmolLM2). `api_key`: required in
    an `api-key` header or `Authorization: Bearer` on every route but `/health`, when set.
    `store`: the controller store's root (None: `AICIRT_STORE` or the user's data directory).
    `max_batch`: requests decoding at once (one engine step serves them all); `max_queue`:
    requests waiting beyond those; a request past both gets 503 with `Retry-After`
    (`retry_after_s`, seconds). `max_context`: prompt + generated tokens a sequence may hold
    (None: the model's own limit, 4096 where the model has none). `default_max_tokens`: when a
    request gives none. `max_upload_bytes`: body limit of `POST /v1/controllers` (the runtime
    also refuses a module over `limits.upload_bytes`). `workers`: controller threads.
    `model_name`: the id `/v1/models` reports (None: derived from `model`). `limits`: every
    controller's sandbox limits (`aicirt.Limits`: times in seconds, sizes in bytes).
    `engine`: "own" (aicirt.engine) or "vllm" (`aicirt.engine.vllm_engine`, docs/vllm.md), with
    `tensor_parallel_size`, `data_parallel_size` and `vllm_args` (a JSON object of more
    `vllm.EngineArgs` fields) for the latter.
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
    engine: str = "own"
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    vllm_args: str | None = None
    limits: Limits = dataclasses.field(default_factory=Limits)

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name != "limits":
                _check_type(f.name, getattr(self, f.name), _types(Settings)[f.name])
        if not isinstance(self.limits, Limits):
            raise ValueError(f"limits must be an aicirt.Limits, got {type(self.limits).__name__}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        for name in ("max_batch", "default_max_tokens", "max_upload_bytes", "workers", "retry_after_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.engine not in ("own", "vllm"):
            raise ValueError(f"engine must be own or vllm, got {self.engine!r}")
        for name in ("tensor_parallel_size", "data_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.engine != "vllm" and (self.tensor_parallel_size != 1 or self.data_parallel_size != 1 or self.vllm_args):
            raise ValueError("tensor_parallel_size, data_parallel_size and vllm_args need engine = vllm")
        if self.vllm_args is not None:
            try:
                ok = isinstance(json.loads(self.vllm_args), dict)
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(f"vllm_args must be a JSON object, got {self.vllm_args!r}")
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
        """Settings from keyword arguments, the `ENV` variables filling those given as None.
        Raises `ValueError` naming an unknown or invalid setting."""
        return cls.load(None, **given)

    @classmethod
    def load(cls, config: str | os.PathLike[str] | None = None, *, limits: Mapping[str, Any] | None = None,
             **given: Any) -> Settings:
        """Settings from, highest first: `given` (the CLI's flags; None means not given), the
        `ENV` variables, the `config` file (see `read_config`), the defaults. `limits`: values
        of `aicirt.Limits` fields (text is parsed by the field's type), over the config file's.
        Raises `ValueError` naming the source and the setting that is unknown or wrong."""
        file: dict[str, Any] = read_config(config) if config is not None else {}
        file_limits = file.pop("limits", {})
        merged: dict[str, Any] = dict(file)
        for name, var in ENV.items():
            if os.environ.get(var):
                merged[name] = os.environ[var]
        known = {f.name for f in fields(cls)} - {"limits"}
        unknown = set(given) - known
        if unknown:
            raise ValueError(f"unknown settings: {', '.join(sorted(unknown))}")
        merged.update({k: v for k, v in given.items() if v is not None})
        lim = {**file_limits, **{k: parse_limit(k, v) for k, v in (limits or {}).items()}}
        return cls(**merged, limits=make_limits(lim))

    @property
    def served_model(self) -> str:
        return self.model_name or (self.model or "smollm2")

    def report(self) -> dict[str, Any]:
        """What `GET /v1/config` shows: every setting (the API key only as whether one is set)
        and every limit, by field name."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "limits"}
        out["api_key"] = "set" if self.api_key else None
        out["limits"] = dataclasses.asdict(self.limits)
        return out


# --- the schema: field types, parsing, the config file ----------------------------------------
@functools.lru_cache(maxsize=None)
def _types(cls: type) -> dict[str, Any]:
    """Field name -> type of a dataclass, in field order."""
    return typing.get_type_hints(cls)


def _type_name(typ: Any) -> str:
    args = [a for a in typing.get_args(typ) if a is not type(None)]
    base = args[0] if args else typ
    name = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(base, str(base))
    return name + (" or null" if type(None) in typing.get_args(typ) else "")


def _check_type(name: str, value: Any, typ: Any) -> None:
    """Raise `ValueError` naming `name` unless `value` fits `typ` (int, float, str, bool, X | None).
    A bool is no integer here, and an integer is a number."""
    args = typing.get_args(typ)
    if value is None and type(None) in args:
        return
    base = next((a for a in args if a is not type(None)), typ)
    ok = (isinstance(value, bool) if base is bool else
          isinstance(value, (int, float)) and not isinstance(value, bool) if base is float else
          isinstance(value, int) and not isinstance(value, bool) if base is int else
          isinstance(value, base))
    if not ok:
        raise ValueError(f"{name} must be {_type_name(typ)}, got {value!r}")


def parse_limit(name: str, value: Any) -> Any:
    """The value of `aicirt.Limits` field `name`: `value` itself, or parsed from text by the
    field's type (as `--limit NAME=VALUE` gives it). Raises `ValueError` naming the limit."""
    types = _types(Limits)
    if name not in types:
        raise ValueError(f"unknown limit {name!r} (limits: {', '.join(types)})")
    if not isinstance(value, str):
        return value
    try:
        return types[name](value) if types[name] is float else int(value, 0)
    except ValueError:
        raise ValueError(f"limit {name} must be {_type_name(types[name])}, got {value!r}") from None


def make_limits(values: Mapping[str, Any]) -> Limits:
    """`aicirt.Limits` with `values` over its defaults; `ValueError` naming an unknown, mistyped
    or out-of-range limit."""
    types = _types(Limits)
    for name, value in values.items():
        if name not in types:
            raise ValueError(f"unknown limit {name!r} (limits: {', '.join(types)})")
        _check_type(f"Limits.{name}", value, types[name])
    return Limits(**values)


def read_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A config file's settings: TOML (`.toml`, Python 3.11+) or JSON (any other name), its top
    level `Settings` field names, the limits in a `limits` table (`[limits]`). Raises
    `ValueError` naming the file and what is wrong (unreadable, not an object, unknown keys)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"config file {p}: cannot read it: {e}") from None
    try:
        if p.suffix == ".toml":
            if sys.version_info < (3, 11):
                raise ValueError("TOML needs Python 3.11 or later; write the config as JSON")
            tomllib = importlib.import_module("tomllib")   # by name: mypy checks for Python 3.10

            data: Any = tomllib.loads(text)
        else:
            data = json.loads(text)
    except ValueError as e:
        raise ValueError(f"config file {p}: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"config file {p}: must hold an object of settings, not {type(data).__name__}")
    known = {f.name for f in fields(Settings)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"config file {p}: unknown settings: {', '.join(unknown)} "
                         f"(settings: {', '.join(sorted(known))})")
    if "limits" in data:
        if not isinstance(data["limits"], dict):
            raise ValueError(f"config file {p}: limits must be a table of limits, not {data['limits']!r}")
        bad = sorted(set(data["limits"]) - set(_types(Limits)))
        if bad:
            raise ValueError(f"config file {p}: unknown limits: {', '.join(bad)} "
                             f"(limits: {', '.join(_types(Limits))})")
    return data


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
