"""pytest fixtures for controller authors (a pytest11 plugin, so installing aicirt enables it).

    def test_digits(aicirt_fuzz):
        aicirt_fuzz("digits.wasm", steps=2000, check=lambda s: s.text_bytes.isdigit() or "not digits")

    def test_digits_hypothesis(aicirt_fuzzer):         # with Hypothesis shrinking the plan itself
        fz = aicirt_fuzzer("digits.wasm")
        @hypothesis.given(aicirt.testing.plans())
        def prop(plan):
            fz.assert_plan(plan)
        prop()

A failure fails the test with the shrunk trace; its reproducer file goes to `.aicirt-fuzz/` in
the rootdir (replay: `aicirt fuzz --replay FILE`).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from aicirt.testing import Fuzzer, FuzzReport


@pytest.fixture(scope="session")
def aicirt_fuzzer() -> Iterator[Callable[..., Fuzzer]]:
    """A factory of :class:`aicirt.testing.Fuzzer` objects, one per (controller, arg, options),
    kept for the session (a Fuzzer owns a Runtime: worth reusing across tests and examples)."""
    from aicirt.testing import Fuzzer

    made: dict[tuple, Fuzzer] = {}

    def get(controller: Any, arg: bytes | str = b"", **options: Any) -> Fuzzer:
        key = (str(controller) if not isinstance(controller, (bytes, bytearray)) else bytes(controller),
               arg, tuple(sorted((k, repr(v)) for k, v in options.items())))
        if key not in made:
            made[key] = Fuzzer(controller, arg, **options)
        return made[key]
    yield get
    for fz in made.values():
        fz.close()


@pytest.fixture
def aicirt_fuzz(aicirt_fuzzer: Callable[..., Fuzzer],
                request: pytest.FixtureRequest) -> Callable[..., FuzzReport]:
    """`aicirt_fuzz(controller, arg=b"", *, steps=1000, seed=0, time_s=None, **Fuzzer options)`:
    fuzz and fail the test on a contract failure; returns the FuzzReport otherwise."""
    def run(controller: Any, arg: bytes | str = b"", *, steps: int = 1000, seed: int = 0, time_s: float | None = None,
            **options: Any) -> FuzzReport:
        fz = aicirt_fuzzer(controller, arg, **options)
        report = fz.fuzz(steps, seed, time_s, reproducer_dir=request.config.rootpath / ".aicirt-fuzz")
        if not report.ok:
            pytest.fail(str(report), pytrace=False)
        return report
    return run
