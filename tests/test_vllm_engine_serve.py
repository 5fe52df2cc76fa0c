"""`aicirt serve --engine vllm`: the same routes, stream format and errors as the own engine's server.

Two live servers side by side: the own engine on the scripted backend over SmolLM2's tokenizer,
and the vLLM engine on SmolLM2. Forced-output scripts (scripted.c, uploaded to each store) go
through AICI's `/v1/run` and OpenAI's `/v1/completions` on both and must stream the same thing;
bad input gets the same 4xx on both and harms nothing. `make test-vllm`.
"""
from __future__ import annotations

import httpx
import pytest
from _server_helpers import aici_run, live_server

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")
pytest.importorskip("fastapi")

from aicirt.serve.settings import Settings  # noqa: E402
from scripted import branch, by_fork_index, result, script, splice, stop, trap, var_set, wait_var  # noqa: E402


def _ascii(*steps) -> str:
    raw = script(*steps)
    assert max(raw) < 0x80     # travels as a JSON string
    return raw.decode("ascii")


SCRIPTS = {
    "splice": _ascii(result(branch(mask=[65])), result(branch(mask=[66])),
                     result(branch(splices=[splice(backtrack=2, ff=[67, 68])])), stop()),
    "fork": _ascii(result(branch(mask=[65]), branch(mask=[66]), branch(splices=[splice(ff=[67, 68])])),
                   by_fork_index(result(branch(mask=[69])), var_set("v", "x", result(branch(mask=[70]))), stop()),
                   stop()),
    "wait": _ascii(result(branch(mask=[71]), branch(mask=[72])),
                   by_fork_index(wait_var("go", result(branch(mask=[73]))), var_set("go", "1", stop())), stop()),
    "into_prompt": _ascii(result(branch(splices=[splice(backtrack=2, ff=[74])])), result(branch(mask=[75])), stop()),
    "trap": _ascii(result(branch(mask=[65])), trap()),
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory, scripted_wasm):
    from aicirt.runner.arg_check import model_tokenizer
    from aicirt.engine.backends import ScriptedBackend

    tok = model_tokenizer(None)
    if tok is None:
        pytest.skip("needs the default model (make setup-vllm)")
    own_settings = Settings(store=str(tmp_path_factory.mktemp("own")), max_context=1024)
    vllm_settings = Settings(store=str(tmp_path_factory.mktemp("vllm")), max_context=1024, engine="vllm",
                             vllm_args='{"max_num_seqs": 16}')
    with live_server(own_settings, backend=ScriptedBackend(tok)) as (own, _), \
            live_server(vllm_settings) as (on_vllm, server):
        assert server.backend.name == "vllm"
        ids = []
        for url in (own, on_vllm):
            r = httpx.post(url + "/v1/controllers", content=scripted_wasm.read_bytes(), timeout=120)
            assert r.status_code == 200, r.text
            ids.append(r.json()["module_id"])
        assert ids[0] == ids[1]
        yield own, on_vllm, ids[0]


def _stream(res: dict) -> list:
    """The streamed edits per fork, as a client sees them."""
    return [(ch["index"], ch["text"], ch.get("backtrack", 0), ch["error"][:60], ch.get("finish_reason"))
            for d in res["objects"][1:] for ch in d["forks"] if ch["text"] or ch.get("backtrack") or ch["error"]
            or ch.get("finish_reason")]


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_aici_run_streams_the_same_on_both_engines(servers, name):
    own, on_vllm, mid = servers
    body = {"controller": mid, "controller_arg": SCRIPTS[name], "prompt": "Go on: ", "max_tokens": 6}
    a, b = aici_run(own, body), aici_run(on_vllm, body)
    for key in ("texts", "finish", "errors"):
        assert b[key] == a[key], key
    # "trace" is appended by every fork, so its interleaving is the steps' (test_vllm_engine.py
    # compares it per sequence); every other variable is the same
    assert {k: v for k, v in b["storage"].items() if k != "trace"} == \
        {k: v for k, v in a["storage"].items() if k != "trace"}
    assert sorted(_stream(b)) == sorted(_stream(a))   # forks interleave by step; each fork's own order is kept
    assert b["usage"]["ff_tokens"] == a["usage"]["ff_tokens"]


def test_forks_and_splices_did_happen(servers):
    own, on_vllm, mid = servers
    res = aici_run(on_vllm, {"controller": mid, "controller_arg": SCRIPTS["fork"], "prompt": "Go on: ",
                             "max_tokens": 6})
    assert res["texts"] == ["QU", "RV", "ST"] and res["storage"]["v"] == "x"   # SmolLM2's tokens 65-70: Q-V
    trapped = aici_run(on_vllm, {"controller": mid, "controller_arg": SCRIPTS["trap"], "prompt": "x", "max_tokens": 6})
    assert trapped["errors"] and trapped["texts"] == ["Q"]


def test_openai_completion_is_the_same_on_both_engines(servers):
    own, on_vllm, mid = servers
    body = {"model": "m", "prompt": "Go on: ", "max_tokens": 6, "controller": mid,
            "controller_arg": SCRIPTS["splice"], "logprobs": 1}
    a = httpx.post(own + "/v1/completions", json=body, timeout=120).json()
    b = httpx.post(on_vllm + "/v1/completions", json=body, timeout=120).json()
    assert b["choices"][0]["text"] == a["choices"][0]["text"] == "ST"
    assert b["choices"][0]["finish_reason"] == a["choices"][0]["finish_reason"]
    assert b["choices"][0]["logprobs"] == a["choices"][0]["logprobs"]
    assert b["usage"] == a["usage"]


@pytest.mark.parametrize("body", [
    {"controller": "no-such-controller", "prompt": "x"},
    {"controller": "regex", "controller_arg": "(19|20[0-9]{2}", "prompt": "x"},
    {"controller": "regex", "controller_arg": "[a-z]+", "prompt": "x " * 3000},
    {"controller": "regex", "controller_arg": "[a-z]+", "prompt": "x", "max_tokens": -3},
])
def test_bad_input_gets_the_same_4xx_and_harms_nothing(servers, body):
    own, on_vllm, mid = servers
    a = httpx.post(own + "/v1/run", json=body, timeout=120)
    b = httpx.post(on_vllm + "/v1/run", json=body, timeout=120)
    assert 400 <= b.status_code < 500 and b.status_code == a.status_code, (a.text, b.text)
    assert b.json() == a.json()
    ok = aici_run(on_vllm, {"controller": mid, "controller_arg": SCRIPTS["splice"], "prompt": "Go on: "})
    assert ok["texts"] == ["ST"] and ok["errors"] == []
