"""`aicirt serve` on the real default model (SmolLM2-135M): slow, needs `make setup-model`."""
from __future__ import annotations

import concurrent.futures as cf
import re

import pytest
from _server_helpers import aici_run, live_server

from aicirt.serve.settings import Settings

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    pytest.importorskip("fastapi")
    pytest.importorskip("torch")
    from aicirt.engine.backends import load_backend

    try:
        backend = load_backend("smollm2")
    except (FileNotFoundError, ImportError) as e:
        pytest.skip(f"the default model is not installed: {e}")
    with live_server(Settings(store=str(tmp_path_factory.mktemp("store"))), backend=backend) as (base, _):
        yield base


def test_openai_client_with_a_controller_on_the_model(url):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    ctrl = {"controller": "regex", "controller_arg": "(19|20)[0-9]{2}"}
    msgs = [{"role": "user", "content": "In which year did World War II end?"}]
    r = client.chat.completions.create(model="smollm2", messages=msgs, temperature=0, max_tokens=10, extra_body=ctrl)
    year = r.choices[0].message.content
    assert re.fullmatch(r"(19|20)[0-9]{2}", year), year
    parts = list(client.chat.completions.create(model="smollm2", messages=msgs, temperature=0, max_tokens=10,
                                                stream=True, extra_body=ctrl))
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == year
    plain = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=5, temperature=0)
    assert plain.choices[0].text.strip() and plain.usage.completion_tokens <= 5


def test_aici_run_with_chat_template_on_the_model(url):
    res = aici_run(url, {"controller": "yesno", "prompt": "Is fire cold?", "chat": True})
    assert res["texts"][0] in ("Yes", "No") and res["storage"]["answer"] == res["texts"][0].lower()
    assert res["finish"] == {0: "aici-stop"} and res["errors"] == []


def test_concurrent_runs_on_the_model_all_complete(url):
    bodies = [{"controller": "regex", "controller_arg": "[a-z ]{5,40}\\.", "prompt": f"Describe the colour {c}: ",
               "max_tokens": 12} for c in ("red", "green", "blue", "black", "white", "pink", "grey", "gold")]
    with cf.ThreadPoolExecutor(len(bodies)) as pool:
        results = list(pool.map(lambda b: aici_run(url, b), bodies))
    for r in results:
        assert r["errors"] == [] and r["finish"][0] in ("aici-stop", "length", "eos")
        assert re.fullmatch(r"[a-z ]{0,40}\.?", r["texts"][0]), r["texts"][0]
