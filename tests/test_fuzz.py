"""aicirt.testing.Fuzzer: the randomised legal engine, its checks, shrinking, reproducers, CLI,
pytest fixture and Hypothesis strategy."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from scripted import branch, parse_trace, result, script, splice, trap

import aicirt
from aicirt import Capabilities
from aicirt.build import toolchain
from aicirt.core.results import Branch, Splice, StepResult
from aicirt.testing import EngineSettings, Fuzzer, Violation, fuzz, plans, replay
from aicirt.testing.harness import FuzzEngine, Track
from aicirt.testing.choices import Choices
from aicirt.testing.pytest_plugin import aicirt_fuzz, aicirt_fuzzer  # noqa: F401  (fixtures)

ALL_BYTES = list(range(256))     # every token but EOS (256)


@pytest.fixture(scope="module")
def regex_wasm():
    return toolchain.build_cached("regex")


def test_a_correct_controller_passes_many_steps_with_its_property_checked(regex_wasm):
    report = fuzz(regex_wasm, "[0-9]{1,5}", steps=600, seed=3,
                  check=lambda s: s.text_bytes.isdigit() and len(s.text_bytes) <= 5 or s.text_bytes)
    assert report.ok, report
    assert report.steps == 600 and report.runs > 10 and report.calls > 300   # late steps apply no result
    assert set(report.finish_reasons) <= {"stop", "eos", "budget"}


def test_the_same_seed_replays_the_same_trace_and_the_plan_replays_it_too(scripted_wasm):
    # forks, conditional splices, backtracks and ff-tokens, all drawn at random by the engine
    steps = script(result(branch(mask=ALL_BYTES), branch(mask=[65, 66, 67], splices=[splice(when=[66], ff=[1, 2])])),
                   result(branch(mask=ALL_BYTES, splices=[splice(when=[7], backtrack=2, ff=[9])])))
    with Fuzzer(scripted_wasm, steps, capabilities=Capabilities.ALL, max_tokens=20) as fz:
        first, again = fz.run(seed=11), fz.run(seed=11)
        assert first.failure is None and first.traces == again.traces and len(first.traces) == 2
        assert fz.run(plan=first.plan).traces == first.traces
        assert fz.run(seed=12).traces != first.traces


def test_a_trap_is_found_shrunk_and_written_to_a_reproducer_that_replays(scripted_wasm, tmp_path):
    arg = script(*[result(branch(mask=ALL_BYTES))] * 6, trap())
    report = fuzz(scripted_wasm, arg, steps=500, seed=0, capabilities=Capabilities.ALL, reproducer_dir=tmp_path)
    assert not report.ok
    f = report.failures[0]
    assert f.kind == "error" and "unreachable" in f.message and f.calls == 7
    # shrinking: no engine backtracks left, so the seventh call comes straight after six samples
    assert [ev[0] for ev in f.trace] == ["result"] * 6 + ["finish"]
    data = json.loads(open(f.reproducer).read())
    assert data["failure"]["kind"] == "error" and data["plan"]["streams"]["0"] == f.plan.streams["0"]
    again = replay(f.reproducer)
    assert again.failure is not None and again.failure.key == f.key
    assert "reproducer:" in str(report)


def test_a_failing_check_shrinks_to_fewer_choices(scripted_wasm):
    with Fuzzer(scripted_wasm, script(result(branch(mask=ALL_BYTES))), capabilities=Capabilities.ALL, max_tokens=12,
                check=lambda s: 200 not in s.generated or "sampled 200") as fz:
        report = fz.fuzz(steps=3000, seed=0)
        assert not report.ok, report
        f = report.failures[0]
        raw = fz.run(seed=f.seed).failure
        assert f.kind == "check" and f.message == "check failed: sampled 200"
        assert f.plan.size < raw.plan.size and sum(1 for v in f.plan.streams["0"] if v) <= 2


FF_UNCHECKED = Path(__file__).parent / "controllers" / "ff_unchecked.c"


def test_using_an_ungranted_capability_is_a_failure():
    report = fuzz(toolchain.build_cached(FF_UNCHECKED), steps=50, capabilities=Capabilities.NONE)
    assert not report.ok and "capability `ff-tokens` was not granted" in report.failures[0].message


def test_random_grants_cover_every_capability(scripted_wasm):
    with Fuzzer(scripted_wasm, script(result(branch(mask=[65]))), max_tokens=2) as fz:
        seen = {fz.run(seed=s, max_steps=1).capabilities for s in range(200)}
    assert len(seen) == 16


def _engine(rt):
    return FuzzEngine(rt, lambda label: Choices(replay=[]), Choices(replay=[]))


@pytest.mark.parametrize("branches, caps, needle", [
    ([Branch(0, None), Branch(1, None)], Capabilities.ALL & ~Capabilities.FORK, "without capability `fork`"),
    ([Branch(0, None, (Splice((), 1, ()),))], Capabilities.ALL & ~Capabilities.BACKTRACK, "`backtrack`"),
    ([Branch(0, None, (Splice((), 0, (5,)),))], Capabilities.ALL & ~Capabilities.FF_TOKENS, "`ff-tokens`"),
    ([Branch(0, None, (Splice((3,), 0, ()),))], Capabilities.ALL & ~Capabilities.CONDITIONAL_FF_TOKENS,
     "`conditional-ff-tokens`"),
    ([Branch(1, None)], Capabilities.ALL, "mask allows no token"),
    ([Branch(0, float("nan"))], Capabilities.ALL, "temperature"),
    ([Branch(None, None, ())], Capabilities.ALL, "no mask but 0 splices"),
])
def test_the_engine_catches_an_illegal_result_the_runtime_would_let_through(scripted_wasm, branches, caps,
                                                                           needle):
    """The fuzzer is an independent oracle: fed a result that breaks docs/protocol.md#semantics, it says so."""
    with aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False) as rt:
        req = rt.new_request(rt.load(scripted_wasm), capabilities=caps)
        seq = req.spawn()
        masks = np.zeros((2, rt.mask_words), np.uint32)
        masks[0, 2] = 1
        forks = [seq] * (len(branches) - 1)
        t = Track("0", seq, [1], 1, Choices(replay=[]))
        with pytest.raises(Violation, match=needle):
            _engine(rt)._apply(t, StepResult(seq, "ok", branches, forks), masks)


def scripted_view(track) -> list[int] | None:
    """The view of tests/controllers/scripted.c, rebuilt from the edits it recorded in "trace"."""
    raw = track.seq.request.var_get("trace")
    if raw is None:
        return None
    views: dict[int, list[int]] = {}
    at_fork: dict[tuple, list[int]] = {}
    for call in parse_trace(raw):
        me, group = call["seq"], tuple(call["fork_group"])
        if group and me == group[0]:
            at_fork[group] = list(views[me])
        view = views.get(me)
        if view is None:
            view = list(at_fork.get(group, views.get(group[0], []))) if group else []
        del view[len(view) - call["backtrack"]:]
        views[me] = view + call["tokens"]
    return views.get(track.seq.id)


FORKING = script(result(branch(mask=ALL_BYTES), branch(mask=[65, 66, 67], splices=[splice(when=[66], ff=[1, 2])])),
                 result(branch(mask=ALL_BYTES, splices=[splice(when=[7], backtrack=2, ff=[9])])))


def test_the_controllers_own_view_matches_the_engine_through_forks_splices_and_backtracks(scripted_wasm):
    with Fuzzer(scripted_wasm, FORKING, capabilities=Capabilities.ALL, max_tokens=24, view=scripted_view,
                settings=EngineSettings(max_tokens=24, backtrack_one_in=3, late_one_in=3)) as fz:
        report = fz.fuzz(steps=400, seed=1)
    assert report.ok, report
    # every run forked once; the last, cut by the step budget, may end before its fork (how many
    # steps each run takes depends on which calls come back late on the machine)
    assert sum(report.finish_reasons.values()) in (2 * report.runs, 2 * report.runs - 1), report


def test_the_engine_catches_a_wrong_view_of_the_tokens(scripted_wasm):
    def off_by_one(track):
        view = scripted_view(track)
        return view[:-1] if view and len(view) > 3 else view
    with Fuzzer(scripted_wasm, FORKING, capabilities=Capabilities.ALL, view=off_by_one) as fz:
        report = fz.fuzz(steps=100, shrink=False)
    assert report.failures[0].kind == "violation" and "the controller's own view is" in report.failures[0].message


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plans())
def test_hypothesis_strategy_drives_the_fuzzer(aicirt_fuzzer, regex_wasm, plan):
    aicirt_fuzzer(regex_wasm, "(ab|cd)+e").assert_plan(plan)


def test_hypothesis_finds_and_shrinks_a_failure(aicirt_fuzzer, scripted_wasm):
    fz = aicirt_fuzzer(scripted_wasm, script(result(branch(mask=ALL_BYTES))), capabilities=Capabilities.ALL,
                       max_tokens=4, check=lambda s: s.generated[0] >= 8 or "first token below 8")

    @settings(max_examples=300, deadline=None, database=None)
    @given(plans(max_choices=8, forks=0, late_steps=False))   # a small search space: shrinking took 30-110 s
    def prop(plan):
        fz.assert_plan(plan)

    with pytest.raises(AssertionError, match="first token below 8"):
        prop()


def test_pytest_fixture_fails_the_test_with_the_trace(aicirt_fuzz, scripted_wasm, regex_wasm):
    assert aicirt_fuzz(regex_wasm, "[a-c]{3}", steps=200).ok
    with pytest.raises(pytest.fail.Exception, match="unreachable"):
        aicirt_fuzz(scripted_wasm, script(result(branch(mask=[65])), trap()), steps=100)


def test_cli_fuzz_passes_and_fails_with_exit_status_and_reproducer(tmp_path):
    from cli import main

    ok = CliRunner().invoke(main, ["fuzz", "regex", "--arg", "[0-9]{3}", "--steps", "300", "--seed", "5"])
    assert ok.exit_code == 0, ok.output
    assert "300 steps" in ok.output and "ok" in ok.output
    bad = CliRunner().invoke(main, ["fuzz", str(FF_UNCHECKED), "--steps", "100", "-c", "none", "--out", str(tmp_path)])
    assert bad.exit_code == 1 and "ff-tokens" in bad.output
    (repro,) = tmp_path.glob("*.json")
    again = CliRunner().invoke(main, ["fuzz", "--replay", str(repro)])
    assert again.exit_code == 1 and "fails again" in again.output
    usage = CliRunner().invoke(main, ["fuzz", "regex", "-c", "telepathy"])
    assert usage.exit_code == 1 and "unknown capability 'telepathy'" in usage.output
