"""`aicirt serve`'s settings and controller limits: one schema (`serve.settings.Settings`) for the
flags, a config file and the environment; every wrong value named in the error; what the server
runs with reported by `GET /v1/config` and applied to its controllers."""
from __future__ import annotations

import dataclasses
import json

import httpx
import pytest
from _server_helpers import aici_run, live_server
from click.testing import CliRunner

from aicirt import Limits
from aicirt.engine.backends import load_backend
from aicirt.serve.settings import Settings

pytest.importorskip("fastapi")


@pytest.fixture
def captured(monkeypatch):
    """`aicirt serve ...` up to the point it would start: the Settings it would start with."""
    import aicirt.serve.commands as commands
    from cli import main

    seen: list[Settings] = []
    monkeypatch.setattr(commands, "serve", lambda settings: seen.append(settings))
    for var in ("AICIRT_API_KEY", "AICIRT_STORE", "AICIRT_MODEL"):
        monkeypatch.delenv(var, raising=False)

    def invoke(*args: str, env: dict | None = None):
        r = CliRunner().invoke(main, ["serve", *args], env=env or {})
        return r, (seen.pop() if seen else None)
    return invoke


def test_flags_then_environment_then_config_file_then_defaults(captured, tmp_path):
    cfg = tmp_path / "serve.toml"
    cfg.write_text('max_batch = 8\nmax_queue = 3\nmodel = "from-file"\nallow_remote = true\n'
                   '[limits]\ncall_timeout_s = 0.5\nmax_forks = 2\n')
    r, s = captured("--config", str(cfg), "--max-queue", "5", "--limit", "max_forks=4",
                    "--limit", "memory_bytes=0x1000000", env={"AICIRT_MODEL": "from-env"})
    assert r.exit_code == 0, r.output
    assert (s.max_batch, s.max_queue, s.model, s.allow_remote, s.workers) == (8, 5, "from-env", True, 2)
    assert s.limits == Limits(call_timeout_s=0.5, max_forks=4, memory_bytes=1 << 24)
    r, s = captured()
    assert r.exit_code == 0 and s == Settings()


def test_a_json_config_file_works_the_same(captured, tmp_path):
    cfg = tmp_path / "serve.json"
    cfg.write_text(json.dumps({"workers": 3, "limits": {"soft_deadline_s": 0.05}}))
    r, s = captured("--config", str(cfg))
    assert r.exit_code == 0, r.output
    assert s.workers == 3 and s.limits == Limits(soft_deadline_s=0.05)


@pytest.mark.parametrize("file, args, needle", [
    ("max_batch = 0\n", [], "max_batch must be >= 1, got 0"),
    ('max_batch = "8"\n', [], "max_batch must be an integer, got '8'"),
    ("allow_remote = 1\n", [], "allow_remote must be true or false, got 1"),
    ("max_bach = 8\n", [], "unknown settings: max_bach"),
    ("[limits]\ncall_timeout_s = -1\n", [], "Limits.call_timeout_s must be > 0, got -1"),
    ('[limits]\ncall_timeout_s = "fast"\n', [], "Limits.call_timeout_s must be a number, got 'fast'"),
    ("[limits]\nmemory = 5\n", [], "unknown limits: memory"),
    ("limits = 5\n", [], "limits must be a table of limits"),
    ("max_batch = [\n", [], "serve.toml: "),
    ("", ["--limit", "call_timeout_s"], "--limit takes NAME=VALUE, got 'call_timeout_s'"),
    ("", ["--limit", "call_timeout=1"], "unknown limit 'call_timeout'"),
    ("", ["--limit", "max_forks=many"], "limit max_forks must be an integer, got 'many'"),
    ("", ["--limit", "max_forks=-1"], "Limits.max_forks must be >= 0, got -1"),
    ("", ["--max-queue", "-1"], "max_queue must be >= 0, got -1"),
    ("", ["--workers", "0"], "workers must be >= 1, got 0"),
    ("", ["--host", "0.0.0.0"], "refusing to listen on 0.0.0.0 without an API key"),
])
def test_a_wrong_setting_is_named_in_the_error(captured, tmp_path, file, args, needle):
    cfg = tmp_path / "serve.toml"
    cfg.write_text(file)
    r, s = captured("--config", str(cfg), *args)
    assert r.exit_code == 2 and s is None, r.output
    assert needle in r.output, r.output


def test_the_server_reports_its_settings_and_applies_its_limits(tmp_path):
    limits = Limits(max_forks=1, call_timeout_s=0.75)
    settings = Settings(store=str(tmp_path), max_batch=4, max_queue=2, api_key="k", limits=limits)
    with live_server(settings, backend=load_backend("scripted")) as (url, server):
        assert httpx.get(url + "/v1/config").status_code == 401
        cfg = httpx.get(url + "/v1/config", headers={"api-key": "k"}).json()
        assert cfg["limits"] == dataclasses.asdict(limits)
        assert (cfg["max_batch"], cfg["max_queue"], cfg["api_key"], cfg["store"]) == (4, 2, "set", str(tmp_path))
        assert cfg["context"] == server.context and cfg["served_model"] == "scripted"
        assert server.runtime.limits == limits
        # choice forks one sequence per option on its first call (three here): over this limit
        r = httpx.post(url + "/v1/run", json={"controller": "choice", "controller_arg": "a\nb\nc", "prompt": "Pick: "},
                       headers={"api-key": "k"}, timeout=120)
        assert r.status_code == 400 and "exceeds the limit of 1 forks per request" in r.json()["message"], r.text
        res = aici_run(url, {"controller": "choice", "controller_arg": "a", "prompt": "Pick: "}, headers={"api-key": "k"})
        assert res["errors"] == [] and res["texts"][1:] == ["a"]        # one fork: within it
