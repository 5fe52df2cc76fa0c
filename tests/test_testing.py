"""aicirt.testing.fuzz_controller: passes a correct controller, pins a broken one to its seed."""
from __future__ import annotations

import re

from scripted import branch, result, script, trap

from aicirt.build import toolchain
from aicirt.testing import fuzz_controller


def test_fuzz_passes_the_regex_controller_and_checks_its_output():
    wasm = toolchain.build_cached("regex")
    report = fuzz_controller(wasm, arg=b"[0-9]{1,5}", runs=20,
                             check=lambda s: re.fullmatch(rb"[0-9]{1,5}", s.text_bytes) is not None or s.text_bytes)
    assert report.ok, report
    assert sum(report.finish_reasons.values()) == 20 and "error" not in report.finish_reasons


def test_fuzz_reports_a_broken_controller_with_reproducible_seeds(scripted_wasm):
    arg = script(result(branch(mask=[1, 2, 3])), result(branch(mask=[4])), trap())
    report = fuzz_controller(scripted_wasm, arg=arg, runs=5, seed=100)
    assert not report.ok and len(report.failures) == 5
    first = report.failures[0]
    assert first.seed == 100 and "unreachable" in first.message and "5 failed" in str(report)
    again = fuzz_controller(scripted_wasm, arg=arg, runs=1, seed=first.seed)
    assert again.failures[0].prompt == first.prompt and again.failures[0].output == first.output


def test_a_failing_check_is_a_failure(scripted_wasm):
    report = fuzz_controller(scripted_wasm, arg=script(result(branch(mask=[65])), result()), runs=3,
                             check=lambda s: s.text_bytes == b"B" or f"got {s.text_bytes!r}")
    assert [f.message for f in report.failures] == ["check failed: got b'A'"] * 3
