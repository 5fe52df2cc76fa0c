"""`aicirt serve --engine vllm --data-parallel-size 2`: two vLLM engine processes behind one server.

One front server (`aicirt.integrations.vllm_dp.create_dp_app`) over two ranks, each a whole
`aicirt serve --engine vllm` on SmolLM2 bound to a core of its own. Requests run on both ranks
at once (the `x-aicirt-rank` header and each rank's own `aicirt_requests_total` say which); the
forced-output scripts of test_vllm_engine_serve.py stream the same through the front, on either
rank, as on a DP-1 server (rank 0's own port); a bad request or a trapping controller on one rank
harms nothing on the other. `make test-vllm`; about 2 minutes on 2 cores.
"""
from __future__ import annotations

import json
import re
import threading

import httpx
import pytest
from _server_helpers import aici_run

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")
pytest.importorskip("fastapi")

from aicirt.serve.background import serve_in_thread  # noqa: E402
from aicirt.serve.settings import Settings  # noqa: E402
from test_vllm_engine_serve import SCRIPTS, _stream  # noqa: E402


@pytest.fixture(scope="module")
def dp(tmp_path_factory, scripted_wasm):
    """(front url, [rank urls], module id)."""
    from aicirt.runner.arg_check import model_tokenizer
    from aicirt.integrations.vllm_dp_app import create_dp_app

    if model_tokenizer(None) is None:
        pytest.skip("needs the default model (make setup-vllm)")
    settings = Settings(store=str(tmp_path_factory.mktemp("dp")), max_context=1024, engine="vllm",
                        data_parallel_size=2, vllm_args='{"max_num_seqs": 8}')
    app = create_dp_app(settings)
    with serve_in_thread(app) as url:
        r = httpx.post(url + "/v1/controllers", content=scripted_wasm.read_bytes(), timeout=120)
        assert r.status_code == 200, r.text
        yield url, list(app.state.ranks.urls), r.json()["module_id"]
    assert all(p.poll() is not None for p in app.state.ranks.procs)     # the ranks ended with the server


def _served(url: str) -> list[float]:
    """Each rank's own count of requests it finished ok (its metrics, labelled by the front)."""
    text = httpx.get(url + "/metrics", timeout=30).text
    got = dict(re.findall(r'aicirt_requests_total\{rank="(\d)",outcome="ok"\} (\S+)', text))
    return [float(got.get(str(r), 0)) for r in range(2)]


def _run_with_rank(url: str, body: dict, out: list, i: int) -> None:
    with httpx.stream("POST", url + "/v1/run", json=body, timeout=300) as r:
        lines = [ln for ln in r.iter_lines() if ln]
        out[i] = (r.status_code, r.headers.get("x-aicirt-rank"), lines[-1])


def test_concurrent_requests_run_on_both_ranks(dp):
    url, ranks, mid = dp
    before = _served(url)
    body = {"controller": "regex", "controller_arg": "[a-z ]{12}", "prompt": "Name two colours: ", "max_tokens": 12}
    out: list = [None] * 4
    threads = [threading.Thread(target=_run_with_rank, args=(url, body, out, i)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(o is not None and o[0] == 200 and o[2] == "data: [DONE]" for o in out), out
    assert sorted(o[1] for o in out) == ["0", "0", "1", "1"]        # least loaded: two each
    after = _served(url)
    assert [a - b for a, b in zip(after, before)] == [2.0, 2.0]      # and each rank ran its two
    metrics = httpx.get(url + "/metrics", timeout=30).text
    assert 'aicirt_dp_in_flight{rank="0"} 0.0' in metrics and 'aicirt_dp_in_flight{rank="1"} 0.0' in metrics
    health = httpx.get(url + "/health", timeout=30).json()
    assert health["status"] == "ok" and len(health["ranks"]) == 2
    config = httpx.get(url + "/v1/config", timeout=30).json()
    assert config["data_parallel_size"] == 2 and config["engine"] == "vllm"


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_scripts_stream_the_same_as_on_one_rank(dp, name):
    url, ranks, mid = dp
    body = {"controller": mid, "controller_arg": SCRIPTS[name], "prompt": "Go on: ", "max_tokens": 6}
    one = aici_run(ranks[0], body)                      # a DP-1 server: rank 0 on its own port
    for _ in range(2):                                  # through the front: one run on each rank
        got = aici_run(url, body)
        for key in ("texts", "finish", "errors"):
            assert got[key] == one[key], key
        # "trace" records the runtime's sequence ids, each server's own count (test_vllm_engine.py
        # compares it per sequence); every other variable is the same
        assert {k: v for k, v in got["storage"].items() if k != "trace"} == \
            {k: v for k, v in one["storage"].items() if k != "trace"}
        # forks interleave by step, and a wait's no-op steps are timing-dependent (as between the
        # engines in test_vllm_engine_serve.py): each fork's own edits, in order, are the same
        assert sorted(_stream(got)) == sorted(_stream(one))
        assert got["usage"]["ff_tokens"] == one["usage"]["ff_tokens"]


def test_openai_route_through_the_front(dp):
    url, ranks, mid = dp
    body = {"model": "m", "prompt": "Go on: ", "max_tokens": 6, "controller": mid,
            "controller_arg": SCRIPTS["splice"], "logprobs": 1}
    a = httpx.post(ranks[0] + "/v1/completions", json=body, timeout=120).json()
    for _ in range(2):
        r = httpx.post(url + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 200 and r.headers["x-aicirt-rank"] in ("0", "1")
        b = r.json()
        assert b["choices"] == a["choices"] and b["usage"] == a["usage"] and b["choices"][0]["text"] == "ST"


BAD = [
    {"controller": "no-such-controller", "prompt": "x"},
    {"controller": "regex", "controller_arg": "(19|20[0-9]{2}", "prompt": "x"},
    {"controller": "regex", "controller_arg": "[a-z]+", "prompt": "x " * 3000},
    {"controller": "regex", "controller_arg": "[a-z]+", "prompt": "x", "max_tokens": -3},
]


def test_a_bad_request_on_one_rank_harms_no_other(dp):
    url, ranks, mid = dp
    # a long request holds one rank; the bad ones and a trapping controller go to the other
    good_body = {"controller": mid, "controller_arg": SCRIPTS["fork"], "prompt": "Go on: ", "max_tokens": 6}
    expected = aici_run(ranks[0], good_body)
    long_out: list = [None]
    long_body = {"controller": "regex", "controller_arg": "[a-z ]{40}", "prompt": "Say something: ",
                 "max_tokens": 40}
    t = threading.Thread(target=_run_with_rank, args=(url, long_body, long_out, 0))
    t.start()
    for body in BAD:
        a = httpx.post(ranks[1] + "/v1/run", json=body, timeout=120)      # what one rank answers alone
        b = httpx.post(url + "/v1/run", json=body, timeout=120)
        assert 400 <= b.status_code < 500 and b.status_code == a.status_code, (a.text, b.text)
        assert b.json() == a.json()
    trapped = aici_run(url, {"controller": mid, "controller_arg": SCRIPTS["trap"], "prompt": "x", "max_tokens": 6})
    assert trapped["errors"] and trapped["texts"] == ["Q"]
    t.join()
    assert long_out[0][0] == 200 and long_out[0][2] == "data: [DONE]"
    for _ in range(2):      # both ranks still serve the whole protocol
        ok = aici_run(url, good_body)
        assert ok["texts"] == expected["texts"] == ["QU", "RV", "ST"] and ok["errors"] == []


def test_store_is_shared_by_the_ranks(dp):
    url, ranks, mid = dp
    r = httpx.post(url + "/v1/controllers/tags", json={"module_id": mid, "tags": ["dp-scripted"]}, timeout=60)
    assert r.status_code == 200, r.text
    for rank in ranks:      # an upload or tag through the front is every rank's at once
        res = aici_run(rank, {"controller": "dp-scripted", "controller_arg": SCRIPTS["splice"], "prompt": "Go on: "})
        assert res["texts"] == ["ST"]
    listed = httpx.get(url + "/v1/controllers/tags", timeout=60).json()
    assert "dp-scripted" in json.dumps(listed)
