"""`aicirt serve` on the scripted engine: a real server on a loopback port, every route and stream
shape, AICI's client's requests replayed as it sends them, the `openai` client, concurrency,
bad input, disconnects, admission control, API keys."""
from __future__ import annotations

import concurrent.futures as cf
import json
import re
import socket
import time

import httpx
import pytest
from _server_helpers import aici_run, live_server, wait_until

from aicirt.engine.backends import load_backend
from aicirt.serve.settings import Settings

pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def served(tmp_path_factory, scripted_wasm):
    """One server for the module: `--model scripted` (with a 1 ms forward, so requests overlap)."""
    settings = Settings(store=str(tmp_path_factory.mktemp("store")), max_context=512, max_upload_bytes=256 << 10,
                        max_batch=64, max_queue=64)
    with live_server(settings, backend=load_backend("scripted", forward_delay_s=0.001)) as (url, server):
        yield url, server


@pytest.fixture
def url(served):
    return served[0]


@pytest.fixture
def server(served):
    return served[1]


def post_json(url, path, body, **kw):
    return httpx.post(url + path, json=body, timeout=60, **kw)


def completion(url, **body):
    r = post_json(url, "/v1/completions", {"temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


# --- routes and shapes ----------------------------------------------------------------------------
def test_health_models_metrics(url):
    h = httpx.get(url + "/health").json()
    assert h["status"] == "ok" and h["model"] == "scripted"
    m = httpx.get(url + "/v1/models").json()
    assert m["object"] == "list" and m["data"][0]["id"] == "scripted" and m["data"][0]["object"] == "model"
    completion(url, prompt="warm up", max_tokens=3)
    text = httpx.get(url + "/metrics").text
    for name in ["aicirt_requests_total", "aicirt_tokens_total", "aicirt_queue_depth", "aicirt_step_seconds_sum",
                 "aicirt_controller_seconds_total", "aicirt_sequence_errors_total", "aicirt_live_sequences"]:
        assert name in text
    assert re.search(r'aicirt_requests_total\{outcome="ok"\} [1-9]', text)
    assert re.search(r'aicirt_tokens_total\{kind="sampled"\} [1-9]', text)


def test_upload_and_tags_as_aici_client_sends_them(url, scripted_wasm, tmp_path):
    import requests     # AICI's client: requests, raw body from an open file, `api-key` header when keyed

    with open(scripted_wasm, "rb") as f:
        r = requests.request("post", url + "/v1/controllers", headers={}, data=f)
    assert r.status_code == 200, r.text
    up = r.json()
    assert set(up) == {"module_id", "wasm_size", "compiled_size", "time"}
    assert up["wasm_size"] == scripted_wasm.stat().st_size and up["compiled_size"] > 0
    r = requests.request("post", url + "/v1/controllers/tags", headers={},
                         json={"module_id": up["module_id"], "tags": ["scripted-test", "scripted-latest"]})
    assert r.status_code == 200, r.text
    tags = r.json()["tags"]
    assert [t["tag"] for t in tags] == ["scripted-test", "scripted-latest"]
    for t in tags:
        assert set(t) == {"tag", "module_id", "updated_at", "updated_by", "wasm_size", "compiled_size"}
        assert t["module_id"] == up["module_id"] and isinstance(t["updated_at"], int)
    listed = requests.request("get", url + "/v1/controllers/tags", headers={}).json()["tags"]
    assert {"scripted-test", "scripted-latest"} <= {t["tag"] for t in listed}
    mods = httpx.get(url + "/v1/controllers").json()["modules"]
    assert up["module_id"] in {m["module_id"] for m in mods}


def test_run_stream_shape_and_variables(url):
    res = aici_run(url, {"controller": "yesno", "controller_arg": "", "prompt": "Is fire cold? ",
                         "max_tokens": 200, "temperature": None})
    assert res["texts"][0] in ("Yes", "No")
    assert res["storage"] == {"answer": res["texts"][0].lower()}
    assert res["finish"] == {0: "aici-stop"} and res["errors"] == []
    u = res["usage"]
    assert u["sampled_tokens"] == 1 and u["ff_tokens"] >= len("Is fire cold? ")
    assert u["cost"] == 2 * u["sampled_tokens"] + u["ff_tokens"]
    assert any(ch["micros"] > 0 for d in res["objects"][1:] for ch in d["forks"])


def test_run_forks_each_carry_their_whole_text(url):
    res = aici_run(url, {"controller": "choice", "controller_arg": "red\ngreen\nblue", "prompt": "Pick: "})
    assert res["texts"][1:] == ["red", "green", "blue"]
    assert res["storage"]["choices"] == "red\ngreen\nblue\n" or res["storage"]["choices"].split() == [
        "red", "green", "blue"]
    assert set(res["finish"]) == {0, 1, 2, 3}


def test_run_backtrack_is_streamed_exactly(url, scripted_wasm):
    from scripted import branch, result, script, splice, stop

    mid = httpx.post(url + "/v1/controllers", content=scripted_wasm.read_bytes()).json()["module_id"]
    # Sample "A", then "B", then take both back and fast-forward "CD", then stop. Words under 128
    # make the script ASCII, so it travels as a JSON string.
    steps = script(result(branch(mask=[65])), result(branch(mask=[66])),
                   result(branch(splices=[splice(backtrack=2, ff=[67, 68])])), stop())
    res = aici_run(url, {"controller": mid, "controller_arg": steps.decode("ascii"), "prompt": "Go: "})
    forks = [ch for d in res["objects"][1:] for ch in d["forks"]]
    assert [(ch["text"], ch.get("backtrack", 0)) for ch in forks if ch["text"] or ch.get("backtrack")] == [
        ("A", 0), ("B", 0), ("CD", 2)]
    assert res["texts"] == ["CD"] and res["finish"] == {0: "aici-stop"}
    assert res["usage"]["sampled_tokens"] == 2 and res["usage"]["ff_tokens"] == len("Go: ") + 2
    whole = completion(url, prompt="Go: ", controller=mid, controller_arg=steps.decode("ascii"))
    assert whole["choices"][0]["text"] == "CD"


def test_controller_arg_json_value_is_passed_as_its_text(url):
    # AICI: a JSON string as is, any other JSON value as its JSON text: ["ab", 12] is a regex
    # (a character class) matching one of the characters of its text.
    res = aici_run(url, {"controller": "regex", "controller_arg": ["ab", 12], "prompt": "x", "max_tokens": 10})
    assert len(res["texts"][0]) == 1 and res["texts"][0] in '"ab, 12'
    res = aici_run(url, {"controller": "regex", "controller_arg": 4321, "prompt": "x", "max_tokens": 10})
    assert res["texts"][0] == "4321"


# --- OpenAI ---------------------------------------------------------------------------------------
def test_openai_client_completions_and_chat(url):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    ctrl = {"controller": "regex", "controller_arg": "[0-9]{3}-[0-9]{4}"}
    c = client.completions.create(model="scripted", prompt="Call me at ", max_tokens=20, temperature=0,
                                  extra_body=ctrl)
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", c.choices[0].text), c.choices[0].text
    assert c.choices[0].finish_reason == "stop" and c.usage.completion_tokens == 8
    chunks = list(client.completions.create(model="scripted", prompt="Call me at ", max_tokens=20, temperature=0,
                                            stream=True, extra_body=ctrl))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == c.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "stop"
    plain = client.completions.create(model="scripted", prompt="Hello", max_tokens=5, temperature=0)
    assert plain.choices[0].finish_reason in ("length", "stop") and plain.usage.prompt_tokens == 5

    msgs = [{"role": "user", "content": "Is fire cold?"}]
    chat = client.chat.completions.create(model="scripted", messages=msgs, temperature=0,
                                          extra_body={"controller": "yesno"})
    answer = chat.choices[0].message.content
    assert answer in ("Yes", "No") and chat.choices[0].message.role == "assistant"
    assert chat.variables == {"answer": answer.lower().encode().hex()}
    stream = client.chat.completions.create(model="scripted", messages=msgs, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"controller": "yesno"})
    parts = list(stream)
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == answer
    assert parts[-1].usage.completion_tokens >= 1 and parts[-1].choices == []


# --- concurrency ----------------------------------------------------------------------------------
def _request(k: int) -> dict:
    """A mix of controllers and sampling settings; each request fully determined by k."""
    kind = k % 5
    base = {"prompt": f"Request {k}: ", "max_tokens": 12 + k % 7}
    if kind == 0:
        return {**base, "controller": "regex", "controller_arg": f"[a-z]{{{2 + k % 4}}}[0-9]+"}
    if kind == 1:
        return {**base, "controller": "yesno"}
    if kind == 2:
        return {**base, "controller": "choice", "controller_arg": "ab\ncd"}
    if kind == 3:
        return {**base, "controller": "regex", "controller_arg": "(yes|no|maybe) [a-z ]*", "temperature": 0.9,
                "seed": k}
    return {**base, "controller": "splice", "controller_arg": "e -> E!\nmax 10", "temperature": 0.7, "seed": k}


def _result(r: dict) -> tuple:
    return tuple(r["texts"]), tuple(sorted(r["storage"].items())), tuple(sorted(r["finish"].items())), \
        tuple(r["errors"]), r["usage"]["sampled_tokens"]


def test_50_concurrent_runs_equal_the_same_runs_alone(url, server):
    n = 50
    alone = [_result(aici_run(url, _request(k))) for k in range(n)]
    peak_before = server.loop.peak_running
    server.loop.peak_running = 0
    with cf.ThreadPoolExecutor(n) as pool:
        together = list(pool.map(lambda k: _result(aici_run(url, _request(k))), range(n)))
    assert server.loop.peak_running > 10, "the requests were not batched together"
    server.loop.peak_running = max(peak_before, server.loop.peak_running)
    for k in range(n):
        assert together[k] == alone[k], (k, _request(k))
    assert all(not r[3] for r in alone)


# --- bad input ------------------------------------------------------------------------------------
def _trapping_module() -> bytes:
    from test_controller_loading import MID_PROCESS, OK_EXPORTS, wat

    return bytes(wat(OK_EXPORTS + MID_PROCESS + '(func (export "_initialize") unreachable)'))


@pytest.fixture(scope="module")
def trapping_id(served):
    r = httpx.post(served[0] + "/v1/controllers", content=_trapping_module())
    assert r.status_code == 200, r.text
    return r.json()["module_id"]


BAD_RUNS = [
    ({"controller": "no-such-tag", "prompt": "x"}, 404, "'no-such-tag' is not a tag, a module id"),
    ({"controller": "0" * 64, "prompt": "x"}, 404, "unknown module id"),
    ({"controller": "/etc/passwd", "prompt": "x"}, 404, "is not a tag, a module id"),
    ({"prompt": "x"}, 400, "controller: Field required"),
    ({"controller": 5, "prompt": "x"}, 400, "controller: Input should be a valid string"),
    ({"controller": "yesno", "prompt": 7}, 400, "prompt: Input should be a valid string"),
    ({"controller": "yesno", "prompt": "x", "max_tokens": "5"}, 400, "max_tokens: Input should be a valid integer"),
    ({"controller": "yesno", "prompt": "x", "max_tokens": -3}, 400, "max_tokens: Input should be greater than"),
    ({"controller": "yesno", "prompt": "x", "max_tokens": 0}, 400, "max_tokens: Input should be greater than"),
    ({"controller": "yesno", "prompt": "x", "max_tokens": 10 ** 12}, 400, "maximum context length is 512"),
    ({"controller": "yesno", "prompt": "x" * 600}, 400, "leave no room in the model's context of 512"),
    ({"controller": "yesno", "prompt": "x" * 500, "max_tokens": 20}, 400, "maximum context length is 512"),
    ({"controller": "yesno", "prompt": ""}, 400, "the prompt has no tokens"),
    ({"controller": "yesno", "prompt": "x", "temperature": -1}, 400, "temperature: Input should be greater"),
    ({"controller": "yesno", "prompt": "x", "top_p": 0}, 400, "top_p: Input should be greater than 0"),
    ({"controller": "yesno", "prompt": "x", "temperature": "hot"}, 400, "temperature: Input should be a valid number"),
]


@pytest.mark.parametrize("body, status, needle", BAD_RUNS)
def test_bad_runs_are_4xx_naming_the_problem(url, body, status, needle):
    r = post_json(url, "/v1/run", body)
    assert r.status_code == status, r.text
    assert needle in r.json()["message"] and needle in r.json()["error"]["message"]


@pytest.mark.parametrize("path, content, status, needle", [
    ("/v1/run", b"{not json", 400, "invalid JSON body"),
    ("/v1/run", b"[1, 2]", 400, "must be a JSON object, not list"),
    ("/v1/run", "\udcff".encode("utf-8", "surrogatepass"), 400, "invalid JSON body"),
    ("/v1/controllers", b"", 400, "empty upload"),
    ("/v1/controllers", b"not wasm at all", 400, "not a core Wasm module"),
    ("/v1/controllers", b"\0asm\x01\0\0\0", 400, "missing export `memory`"),
    ("/v1/controllers", b"\0asm\x01\0\0\0" + b"\0" * (300 << 10), 413, "over the limit of 262144"),
    ("/v1/controllers/tags", b'{"module_id": "abc", "tags": ["t"]}', 400, "must be 64 lowercase hex digits"),
    ("/v1/controllers/tags", json.dumps({"module_id": "0" * 64, "tags": ["t"]}).encode(), 404, "unknown module id"),
    ("/v1/controllers/tags", b'{"module_id": "x", "tags": "t"}', 400, "tags: Input should be a valid list"),
    ("/v1/controllers/tags", b'{"module_id": "x", "tags": []}', 400, "tags: List should have at least 1 item"),
    ("/v1/completions", b'{"prompt": "x", "n": 17}', 400, "n: Input should be less than or equal to 16"),
    ("/v1/completions", b'{"prompt": "x", "stop": ["\\n", ""]}', 400, "stop: a stop string must not be empty"),
    ("/v1/completions", b'{"max_tokens": 3}', 400, "prompt: Field required"),
    ("/v1/completions", b'{"prompt": "x", "controller": "nope"}', 404, "'nope' is not a tag"),
    ("/v1/chat/completions", b'{"messages": []}', 400, "messages: List should have at least 1 item"),
    ("/v1/chat/completions", b'{"messages": [{"role": "robot", "content": "x"}]}', 400, "messages.0.role"),
    ("/v1/nowhere", b"{}", 404, "no route POST /v1/nowhere"),
])
def test_bad_bodies_are_4xx_naming_the_problem(url, path, content, status, needle):
    r = httpx.post(url + path, content=content, timeout=30)
    assert r.status_code == status, r.text
    assert needle in r.json()["message"]


def test_bad_tag_names_are_refused(url, scripted_wasm):
    mid = httpx.post(url + "/v1/controllers", content=scripted_wasm.read_bytes()).json()["module_id"]
    for bad in ["1x", "a b", "x" * 51, "f" * 64]:
        r = post_json(url, "/v1/controllers/tags", {"module_id": mid, "tags": [bad]})
        assert r.status_code == 400 and "tag" in r.json()["message"], r.text


def test_controller_that_fails_to_instantiate_is_a_400(url, trapping_id):
    r = post_json(url, "/v1/run", {"controller": trapping_id, "prompt": "x"})
    assert r.status_code == 400
    assert "controller failed to start" in r.json()["message"] and "unreachable" in r.json()["message"]


#: Arguments the shipped controllers refuse on their first call, and the reason each logs:
#: the regex one traps after logging it, the json one stops having logged it.
REFUSED = [("regex", "(", "regex: missing ) at offset 1 in pattern '('"),
           ("json", json.dumps({"type": "frobnicate"}), "json: bad schema: type at # (unknown type name)")]


def _refused_bodies(controller: str, arg: str) -> list[tuple[str, dict]]:
    ctrl = {"controller": controller, "controller_arg": arg}
    chat = {"messages": [{"role": "user", "content": "Go"}], **ctrl}
    return [("/v1/run", {"prompt": "Go: ", **ctrl}),
            ("/v1/completions", {"prompt": "Go: ", **ctrl}),
            ("/v1/completions", {"prompt": "Go: ", "stream": True, **ctrl}),
            ("/v1/chat/completions", chat),
            ("/v1/chat/completions", {**chat, "stream": True})]


@pytest.mark.parametrize("controller, arg, reason", REFUSED, ids=["regex-paren", "json-bad-schema"])
def test_a_refused_argument_is_a_400_leading_with_the_controllers_reason_on_every_route(
        url, controller, arg, reason):
    for path, body in _refused_bodies(controller, arg):
        r = post_json(url, path, body)
        assert r.status_code == 400, (path, body, r.text)
        message = r.json()["message"]
        assert message.startswith(reason + " (controller failed to start: "), (path, message)
        assert r.json()["error"]["message"] == message and "\n" not in message


def test_bad_requests_change_no_other_output(url, trapping_id):
    good = {"controller": "regex", "controller_arg": "[a-z]{30}", "prompt": "Steady: ", "max_tokens": 40}
    alone = aici_run(url, good)["texts"]
    with cf.ThreadPoolExecutor(8) as pool:
        runs = [pool.submit(aici_run, url, good) for _ in range(3)]
        bad = [pool.submit(post_json, url, "/v1/run", b) for b, _, _ in BAD_RUNS]
        bad.append(pool.submit(post_json, url, "/v1/run", {"controller": trapping_id, "prompt": "x"}))
        assert all(400 <= f.result().status_code < 500 for f in bad)
        assert all(f.result()["texts"] == alone for f in runs)
    assert httpx.get(url + "/health").json()["status"] == "ok"


# --- disconnects, admission control, keys ---------------------------------------------------------
def test_client_disconnect_frees_its_sequences(url, server):
    steady = {"controller": "regex", "controller_arg": "[a-z]{60}", "prompt": "Other: ", "max_tokens": 80}
    alone = aici_run(url, steady)["texts"]
    wait_until(lambda: server.loop.live_sequences() == 0, what="an idle engine")
    with cf.ThreadPoolExecutor(1) as pool:
        other = pool.submit(aici_run, url, steady)
        body = {"controller": "choice", "controller_arg": "a\nb\nc", "prompt": "Long: ", "max_tokens": 400}
        # A raw socket, so the disconnect is a real close, mid-stream.
        host, port = url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)))
        payload = json.dumps({**body, "controller": "regex", "controller_arg": "[a-z]{390}"}).encode()
        sock.sendall(b"POST /v1/run HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        got = b""
        while got.count(b"data: ") < 4:
            got += sock.recv(65536)
        assert b" 200 OK" in got.split(b"\r\n", 1)[0]
        live = server.loop.live_sequences()
        assert live >= 1
        sock.close()
        wait_until(lambda: server.loop.live_sequences() <= (1 if not other.done() else 0), timeout_s=10,
                   what="the disconnected request's sequences to go")
        assert other.result()["texts"] == alone
    wait_until(lambda: server.loop.live_sequences() == 0, what="an idle engine")
    metrics = httpx.get(url + "/metrics").text
    assert re.search(r'aicirt_requests_total\{outcome="cancelled"\} [1-9]', metrics)


def test_past_the_queue_is_503_with_retry_after(tmp_path):
    settings = Settings(store=str(tmp_path), max_batch=1, max_queue=1, retry_after_s=3)
    with live_server(settings, backend=load_backend("scripted", forward_delay_s=0.01)) as (url, server):
        body = {"controller": "regex", "controller_arg": "[a-z]{200}", "prompt": "x", "max_tokens": 200}
        with cf.ThreadPoolExecutor(2) as pool:
            first = pool.submit(aici_run, url, body)
            wait_until(lambda: server.loop.running == 1, what="the first request running")
            second = pool.submit(aici_run, url, body)
            wait_until(lambda: server.loop.queue_depth == 1, what="the second request queued")
            r = post_json(url, "/v1/run", body)
            assert r.status_code == 503 and r.headers["retry-after"] == "3"
            assert "limit (1 running + 1 queued)" in r.json()["message"]
            assert first.result()["texts"] == second.result()["texts"]
        assert post_json(url, "/v1/completions", {"prompt": "x", "max_tokens": 2}).status_code == 200


def test_api_key(tmp_path):
    with live_server(Settings(store=str(tmp_path), api_key="s3cret"), backend=load_backend("scripted")) as (url, _):
        assert httpx.get(url + "/health").status_code == 200
        r = httpx.get(url + "/v1/controllers/tags")
        assert r.status_code == 401 and "API key" in r.json()["message"]
        assert httpx.get(url + "/v1/models", headers={"api-key": "wrong"}).status_code == 401
        assert httpx.get(url + "/v1/controllers/tags", headers={"api-key": "s3cret"}).status_code == 200
        assert httpx.get(url + "/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        res = aici_run(url, {"controller": "yesno", "prompt": "Is it?"}, headers={"api-key": "s3cret"})
        assert res["texts"][0] in ("Yes", "No")


def test_no_key_no_remote_bind():
    with pytest.raises(ValueError, match="refusing to listen on 0.0.0.0 without an API key"):
        Settings(host="0.0.0.0")
    assert Settings(host="0.0.0.0", allow_remote=True).host == "0.0.0.0"
    assert Settings(host="0.0.0.0", api_key="k").api_key == "k"
    assert Settings(host="::1").host == "::1" and Settings(host="localhost").host == "localhost"
    from click.testing import CliRunner

    from cli import main

    r = CliRunner().invoke(main, ["serve", "--host", "0.0.0.0", "--model", "scripted"], env={"AICIRT_API_KEY": ""})
    assert r.exit_code == 2 and "refusing to listen on 0.0.0.0" in r.output


def test_importing_the_store_pulls_in_no_web_framework():
    import subprocess
    import sys

    code = ("import sys, aicirt, aicirt.serve, aicirt.serve.store, aicirt.serve.settings; "
            "print([m for m in ('fastapi', 'starlette', 'uvicorn', 'httpx', 'pydantic') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_engine_thread_survives_a_burst_of_cancels(url, server):
    """Streams opened and dropped at once, many times: the server keeps serving, nothing leaks."""
    body = {"controller": "regex", "controller_arg": "[a-z]{100}", "prompt": "Burst: ", "max_tokens": 100}
    for _ in range(20):
        with httpx.stream("POST", url + "/v1/run", json=body, timeout=30) as r:
            assert r.status_code == 200
            next(r.iter_lines())
    wait_until(lambda: server.loop.live_sequences() == 0 and server.loop.running == 0
               and not server.loop.engine.requests, what="all cancelled and retired")
    t0 = time.perf_counter()
    assert aici_run(url, {"controller": "yesno", "prompt": "Still there?"})["errors"] == []
    assert time.perf_counter() - t0 < 10


def test_docs_curl_examples_work(url, tmp_path):
    """Every curl line of docs/server.md's routes, in order, against this server."""
    import os
    import shutil
    import subprocess
    from pathlib import Path

    from aicirt.build import toolchain

    if not shutil.which("curl"):
        pytest.skip("no curl here")
    doc = (Path(__file__).resolve().parent.parent / "docs" / "server.md").read_text()
    routes = doc.split("## Routes", 1)[1].split("## The store", 1)[0]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", routes, re.S):
        for cmd in block.replace("\\\n", " ").splitlines():
            if cmd.startswith("curl"):
                commands.append(cmd.split("  #")[0])
    assert len(commands) >= 10
    toolchain.build("yesno", tmp_path / "yesno.wasm", progress=False)
    env = {**os.environ, "URL": url}
    for cmd in commands:
        r = subprocess.run(cmd, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stdout, (cmd, r.stderr)
        assert '"error":{' not in r.stdout and '"message"' not in r.stdout, (cmd, r.stdout)
        if "/v1/controllers --data-binary" in cmd:
            env["MODULE_ID"] = json.loads(r.stdout)["module_id"]


def test_a_failing_engine_step_fails_its_requests_not_the_server(tmp_path):
    import numpy as np

    from aicirt.engine.backends import ScriptedBackend

    def logits(tokens):
        text = bytes(t for t in tokens if t < 256)
        if text.endswith(b"BOOM") or (text.startswith(b"later") and text.endswith(b"aa")):
            raise RuntimeError("the model fell over")
        return np.zeros(257, dtype=np.float32)      # greedy under [a-z]: "a" every step

    with live_server(Settings(store=str(tmp_path)), backend=ScriptedBackend(logits_fn=logits)) as (url, server):
        # On the first step: no stream yet, so a 500 naming the failure.
        r = post_json(url, "/v1/run", {"controller": "regex", "controller_arg": "[a-z]{5}", "prompt": "BOOM"})
        assert r.status_code == 500 and "engine step failed: RuntimeError: the model fell over" in r.json()["message"]
        # Mid-stream: the stream ends with the error on the fork.
        res = aici_run(url, {"controller": "regex", "controller_arg": "[a-z]{5}", "prompt": "later"})
        assert res["texts"] == ["aa"] and res["finish"] == {0: "fail"}
        assert "engine step failed: RuntimeError: the model fell over" in res["errors"][0]
        ok = aici_run(url, {"controller": "regex", "controller_arg": "[a-z]{5}", "prompt": "fine"})
        assert ok["errors"] == [] and ok["texts"] == ["aaaaa"]
        assert re.search(r"aicirt_engine_errors_total 2", httpx.get(url + "/metrics").text)


def test_a_fault_outside_any_request_answers_500_and_does_not_spin(tmp_path):
    """A fault in the engine loop that no running request explains (here the engine's `collect`,
    called every turn, raising) used to retry forever in a tight loop while every request waited:
    now a request that cannot start gets a 500 naming the fault, and the loop backs off."""
    from aicirt.engine.backends import ScriptedBackend

    with live_server(Settings(store=str(tmp_path)), backend=ScriptedBackend()) as (url, server):
        engine = server.loop.engine
        calls = []

        def broken() -> None:
            calls.append(1)
            raise RuntimeError("collect broke")

        engine.collect = broken   # type: ignore[method-assign]
        r = post_json(url, "/v1/run", {"controller": "regex", "controller_arg": "[a-z]{5}", "prompt": "x"})
        assert r.status_code == 500 and "internal error: RuntimeError: collect broke" in r.json()["message"]
        seen = len(calls)
        time.sleep(0.3)
        assert len(calls) <= seen + 2     # idle after answering: no retry loop
        del engine.collect                # repaired: the server serves again
        ok = aici_run(url, {"controller": "regex", "controller_arg": "[a-z]{5}", "prompt": "fine"})
        assert ok["errors"] == [] and len(ok["texts"][0]) == 5
