"""The vLLM plugin's admission (`aicirt.integrations.admission`): a controller's first call is
judged against the model's own vocabulary, never refused for the byte stand-in's (no vLLM needed)."""
from __future__ import annotations

import pytest
import scripted as S

from aicirt.build import toolchain
from aicirt.runner.arg_check import model_tokenizer
from aicirt.integrations.admission import MODEL_ENV, FirstCallCheck

FF_1059 = S.script(S.result(S.branch(splices=[S.splice(ff=[1059])])))     # legal on SmolLM2 (49,152 tokens)
FF_60000 = S.script(S.result(S.branch(splices=[S.splice(ff=[60000])])))   # past SmolLM2's vocabulary
MASK_1059 = S.script(S.result(S.branch(mask=[1059])))


@pytest.fixture
def stand_in(monkeypatch):
    monkeypatch.delenv(MODEL_ENV, raising=False)
    c = FirstCallCheck()
    yield c
    c.close()


@pytest.fixture
def smollm2():
    if model_tokenizer(None) is None:
        pytest.skip("needs the default model's tokenizer (make setup-model)")
    c = FirstCallCheck("smollm2")
    yield c
    c.close()


def test_the_stand_in_never_refuses_a_token_past_its_own_vocabulary(stand_in, scripted_wasm):
    assert stand_in.refusal(scripted_wasm, FF_1059) is None
    assert stand_in.refusal(scripted_wasm, MASK_1059) is None
    assert stand_in.stand_in
    # what the argument alone decides is still refused there
    regex = toolchain.build_cached(toolchain.CONTROLLERS_DIR / "regex")
    assert stand_in.refusal(regex, "(19|20[0-9]{2}").startswith("regex: ")
    assert "stopped on its first call" in stand_in.refusal(scripted_wasm, S.script(S.log("no", S.stop())))


def test_the_models_vocabulary_judges_when_the_model_is_known(smollm2, scripted_wasm):
    assert smollm2.refusal(scripted_wasm, FF_1059) is None
    assert smollm2.refusal(scripted_wasm, MASK_1059) is None
    assert not smollm2.stand_in
    why = smollm2.refusal(scripted_wasm, FF_60000)
    assert why is not None and "60000 >= vocab size 49152" in why


def test_the_model_comes_from_use_model_or_the_environment(monkeypatch, scripted_wasm):
    if model_tokenizer(None) is None:
        pytest.skip("needs the default model's tokenizer (make setup-model)")
    monkeypatch.setenv(MODEL_ENV, "smollm2")
    from_env = FirstCallCheck()
    try:
        assert "49152" in from_env.refusal(scripted_wasm, FF_60000) and not from_env.stand_in
    finally:
        from_env.close()
    monkeypatch.delenv(MODEL_ENV)
    check = FirstCallCheck()
    try:
        assert check.refusal(scripted_wasm, FF_60000) is None and check.stand_in   # the stand-in cannot tell
        check.use_model(None)                                                      # the default model
        assert "49152" in check.refusal(scripted_wasm, FF_60000) and not check.stand_in
    finally:
        check.close()
