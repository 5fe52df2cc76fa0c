"""`aicirt upload|tags|ls|rm|run` print the same against a server (`--server`) as on the local store."""
from __future__ import annotations

import json
import re

import pytest
from _server_helpers import live_server
from click.testing import CliRunner

from aicirt.engine.backends import load_backend
from aicirt.serve.settings import Settings
from cli import main

pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    settings = Settings(store=str(tmp_path_factory.mktemp("server-store")))
    with live_server(settings, backend=load_backend("scripted")) as (url, _):
        yield url


def _normal(text: str) -> str:
    """Timings and times of day differ between two runs; everything else must not."""
    text = re.sub(r"compiled in \d+ ms", "compiled in N ms", text)
    return re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "DATE", text)


def _cli(*args, env=None):
    r = CliRunner().invoke(main, list(args), env=env or {})
    return r.exit_code, _normal(r.output)


def test_store_commands_print_the_same_locally_and_against_a_server(server_url, scripted_wasm, tmp_path):
    local = ["--store", str(tmp_path / "local")]
    remote = ["--server", server_url]
    script = [
        ["upload", str(scripted_wasm), "-t", "one", "-t", "two"],
        ["upload", "yesno", "-t", "yn"],                   # a shipped name, built first
        ["tags"], ["ls"],
        ["rm", "one"], ["tags"],
        ["rm", "nope"],
        ["upload", str(tmp_path / "missing.wasm")],
        ["upload", str(scripted_wasm), "-t", "9bad"],
    ]
    for cmd in script:
        a, b = _cli(*cmd, *local), _cli(*cmd, *remote)
        assert a == b, (cmd, a, b)
    code, out = _cli("tags", *local)
    assert code == 0 and "two" in out and "yn" in out and "one" not in out
    assert _cli("rm", "nope", *local)[1].strip() == "Error: unknown tag 'nope'"
    # A module id removes the module and its tags, in both places.
    mid = re.search(r"^([0-9a-f]{64})", _cli("ls", *local)[1], re.M).group(1)
    assert _cli("rm", mid, *local) == _cli("rm", mid, *remote)
    assert _cli("ls", *local) == _cli("ls", *remote)


def test_run_prints_the_same_locally_and_against_a_server(server_url, tmp_path):
    args = ["run", "yesno", "--prompt", "Is fire cold?"]
    _, local_out = _cli(*args, "--model", "scripted", "--store", str(tmp_path))
    _, remote_out = _cli(*args, "--server", server_url)
    first = lambda out: out.splitlines()[0]  # noqa: E731  (stdout first; the summary lines differ in timing)
    assert first(local_out) == first(remote_out) and first(local_out) in ("Yes", "No")
    code, out = _cli(*args, "--server", server_url, "--json")
    assert code == 0
    res = json.loads(out)
    assert res["sequences"][0]["text"] == first(local_out) and res["sequences"][0]["finish_reason"] == "stop"
    assert res["variables"] == {"answer": first(local_out).lower()}


def test_run_uploads_a_local_file_first_and_accepts_tags(server_url, tmp_path):
    code, out = _cli("build", "regex", "-o", str(tmp_path / "regex.wasm"))
    assert code == 0, out
    code, out = _cli("run", str(tmp_path / "regex.wasm"), "--arg", "[0-9]{4}", "--no-chat", "--prompt", "Year: ",
                     "--server", server_url, "--json")
    assert code == 0, out
    res = json.loads(out)
    assert re.fullmatch(r"[0-9]{4}", res["sequences"][0]["text"])
    assert _cli("upload", str(tmp_path / "regex.wasm"), "-t", "re", "--server", server_url)[0] == 0
    code, out = _cli("run", "re", "--arg", "[0-9]{4}", "--no-chat", "--prompt", "Year: ", "--server", server_url,
                     "--json")
    assert json.loads(out)["sequences"][0]["text"] == res["sequences"][0]["text"]


def test_run_locally_by_tag_and_module_id(tmp_path):
    store = ["--store", str(tmp_path)]
    code, out = _cli("upload", "yesno", "-t", "yn", *store)
    assert code == 0, out
    mid = out.split()[0]
    outs = [_cli("run", name, "--prompt", "Is it?", "--model", "scripted", "--json", *store) for name in ("yn", mid)]
    assert outs[0][0] == 0 and outs[1][0] == 0
    texts = [[s["text"] for s in json.loads(o)["sequences"]] for _, o in outs]
    assert texts[0] == texts[1] and texts[0][0] in ("Yes", "No")
    code, out = _cli("run", "missing-tag", "--model", "scripted", *store)
    assert code == 1 and "'missing-tag' is not a file, a tag, a module id or a shipped controller" in out


def test_server_errors_are_one_line(tmp_path):
    code, out = _cli("tags", "--server", "http://127.0.0.1:9")
    assert code == 1 and "cannot reach the server" in out


@pytest.mark.parametrize("controller, arg, reason", [
    ("regex", "(", "regex: missing ) at offset 1 in pattern '('"),
    ("json", json.dumps({"type": "frobnicate"}), "json: bad schema: type at # (unknown type name)")])
def test_run_leads_a_refused_argument_with_the_controllers_reason_locally_and_against_a_server(
        server_url, tmp_path, controller, arg, reason):
    args = ["run", controller, "--arg", arg, "--prompt", "Go"]
    for where, extra in [("local", ["--model", "scripted", "--store", str(tmp_path)]),
                         ("server", ["--server", server_url])]:
        code, out = _cli(*args, *extra)
        last = out.strip().splitlines()[-1]
        assert code == 1 and last.startswith(f"Error: {reason} ("), (where, out)


def test_run_against_a_server_fails_when_a_sequence_fails_as_locally_does(server_url, scripted_wasm, tmp_path):
    from scripted import branch, log, result, script, trap

    steps = script(result(branch(mask=[ord("A")])), log("giving up: bad state\n", trap())).decode("ascii")
    code, out = _cli("run", str(scripted_wasm), "--arg", steps, "--prompt", "hi", "--no-chat", "--server", server_url)
    last = out.strip().splitlines()[-1]
    assert code == 1 and last.startswith("Error: sequence #0 ended in error: giving up: bad state ("), out
