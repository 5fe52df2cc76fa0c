"""`aicirt serve` takes JS scripts: the shipped `js` controller with the script as its argument
(AICI's `/v1/run`), and its error's message reaches the client."""
from __future__ import annotations

import httpx
import pytest
from _server_helpers import aici_run, live_server

from aicirt import Limits
from aicirt.engine.backends import load_backend
from aicirt.serve.settings import Settings
from aicirt.build.toolchain import CONTROLLERS_DIR, build_cached

import fastapi  # noqa: E402,F401  (the dev extra: a missing one fails, never skips)
pytestmark = pytest.mark.slow   # the server compiles QuickJS in its own store (~10 s of CPU)


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    build_cached("js")
    # QuickJS's 1 MiB module compiles in ~10 s of CPU: a loaded test machine needs more than the
    # 30 s of wall-clock time the default allows (the limit is wall-clock: docs/protocol.md#limits)
    settings = Settings(store=str(tmp_path_factory.mktemp("store")), max_context=512,
                        limits=Limits(compile_timeout_s=300.0))
    with live_server(settings, backend=load_backend("scripted")) as (url, _):
        yield url


def test_the_server_runs_a_script_given_as_the_argument(url):
    script = (CONTROLLERS_DIR / "js" / "examples" / "yesno.js").read_text()
    res = aici_run(url, {"controller": "js", "controller_arg": script, "prompt": "Is fire cold? ", "max_tokens": 20})
    assert res["errors"] == [] and res["texts"][0] in ("Yes", "No")
    assert res["storage"] == {"answer": res["texts"][0].lower()}


def test_a_script_error_reaches_the_client(url):
    """A script that fails on its first call is refused before the stream starts (as any argument
    a controller rejects), with the JS message and stack."""
    r = httpx.post(url + "/v1/run", json={"controller": "js", "controller_arg": "function midProcess(a) { null.x; }",
                                          "prompt": "x", "max_tokens": 5}, timeout=120)
    assert r.status_code == 400
    msg = r.json()["message"]
    assert "midProcess threw: TypeError: cannot read property 'x' of null" in msg and "at midProcess (<script>:1" in msg
