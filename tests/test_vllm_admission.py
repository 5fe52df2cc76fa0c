"""aicirt.integrations.admission: a controller's first call at admission, on the stand-in (no vLLM)."""
from __future__ import annotations

import pytest
import scripted as S

from aicirt.build import toolchain
from aicirt.integrations.admission import FirstCallCheck


@pytest.fixture
def check():
    c = FirstCallCheck()
    yield c
    c.close()


def test_a_regex_that_does_not_parse_is_refused_with_the_controllers_own_reason(check):
    regex = toolchain.build_cached(toolchain.CONTROLLERS_DIR / "regex")
    why = check.refusal(regex, "(19|20[0-9]{2}")
    assert why is not None and why.startswith("regex: ") and "(19|20[0-9]{2}" in why, why
    assert check.refusal(regex, "(19|20)[0-9]{2}") is None


def test_a_stop_with_a_reason_and_a_trap_are_refused_a_quiet_stop_is_not(check, scripted_wasm):
    said = check.refusal(scripted_wasm, S.script(S.log("choices must differ", S.stop())))
    assert said == "choices must differ (it stopped on its first call)"
    trapped = check.refusal(scripted_wasm, S.script(S.log("bad arg", S.trap())))
    assert trapped is not None and trapped.startswith("bad arg (") and "trap" in trapped
    assert check.refusal(scripted_wasm, S.script(S.stop())) is None
    assert check.refusal(scripted_wasm, S.script(S.result(S.branch(mask=[65])))) is None


def test_answers_are_remembered_and_the_runtime_starts_on_first_use(check, scripted_wasm):
    assert check._runtime is None
    arg = S.script(S.log("no", S.stop()))
    first = check.refusal(scripted_wasm, arg)
    runtime = check._runtime
    assert runtime is not None and check.refusal(scripted_wasm, arg) == first and len(check._seen) == 1
    check.close()
    check.close()   # idempotent
