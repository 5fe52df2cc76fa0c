"""`aicirt run` without a real model: the scripted backend, the scripted test controller."""
from __future__ import annotations

import io
import json

from aicirt.run_command import run
from scripted import branch, by_fork_index, result, script, splice, stop, var_set


def go(wasm, *steps, **kw):
    out, err = io.StringIO(), io.StringIO()
    res = run(str(wasm), arg=script(*steps), prompt="hi", model="scripted", out=out, err=err, color=False, **kw)
    return res, out.getvalue(), err.getvalue()


def test_streams_text_and_shows_backtracks(scripted_wasm):
    res, out, err = go(scripted_wasm, result(branch(mask=[ord("A")])),
                       result(branch(mask=[ord("B")], splices=[splice(backtrack=2, ff=list(b"xy"))])), stop())
    assert out.splitlines()[0] == "AB[⌫AB]xy"  # B was sampled, then it and A were taken back
    assert res["sequences"][0]["text"] == "xy" and res["sequences"][0]["finish_reason"] == "stop"
    assert "#0: stop" in err and "tokens/s" in err and "hidden" in err


def test_labels_forks_and_prints_variables(scripted_wasm):
    res, out, err = go(scripted_wasm, result(branch(mask=[ord("a")]), branch(mask=[ord("b")])),
                       by_fork_index(stop(), var_set("k", "v", stop())))
    assert "[#0 forked #1]" in out and "[#1] b" in out and "[#0] a" in out
    assert "k = v" in err
    assert [s["text"] for s in res["sequences"]] == ["a", "b"]


def test_json_output(scripted_wasm):
    out = io.StringIO()
    run(str(scripted_wasm), arg=script(result(branch(splices=[splice(ff=list(b"ok"))])), stop()), prompt="hi",
        model="scripted", as_json=True, out=out, err=io.StringIO())
    data = json.loads(out.getvalue())
    assert data["sequences"][0]["text"] == "ok" and data["timing"]["tokens"] == 2
    assert "trace" in data["variables"]


def test_bad_module_fails_before_the_model_loads(tmp_path):
    import pytest

    from aicirt import LoadError
    bad = tmp_path / "bad.wasm"
    bad.write_bytes(b"\0asm\x01\0\0\0")
    with pytest.raises(LoadError, match="missing export `mid-process`"):
        run(str(bad), model="/no/such/model")   # the model would raise FileNotFoundError
