"""Testing tools for controller authors.

- :class:`Fuzzer` / :func:`fuzz`: drive a controller through a seeded, legal, randomised engine
  (random tokens inside its masks, random capability grants, forks, splices, no-ops, late steps,
  backtracks by the engine), check the contract after every step, shrink a failure to a short
  trace and write a reproducer file (:func:`replay` runs it again).
- :func:`fuzz_controller`: a quicker check against a seeded fake model (`aicirt.engine.Engine`).
- pytest: the `aicirt_fuzz` fixture (plugin `aicirt.testing.pytest_plugin`) and the Hypothesis
  strategy :func:`plans` (`aicirt.testing.strategies`) make either one line in a test.
"""
from typing import TYPE_CHECKING, Any

from .choices import Choices, Plan
from .fuzzer import Check, Finished, FuzzFailure, Fuzzer, FuzzReport, RunResult, fuzz
from .harness import EngineSettings, FuzzEngine, Track, Violation
from .model_fuzz import fuzz_controller
from .reproducer import load_reproducer, replay, write_reproducer

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy


def plans(**kwargs: Any) -> "SearchStrategy[Plan]":
    """Hypothesis strategy of fuzz plans (see :func:`aicirt.testing.strategies.plans`)."""
    from .strategies import plans as _plans
    return _plans(**kwargs)


__all__ = ["Check", "Choices", "EngineSettings", "Finished", "FuzzEngine", "FuzzFailure", "FuzzReport", "Fuzzer",
           "Plan", "RunResult", "Track", "Violation", "fuzz", "fuzz_controller", "load_reproducer", "plans", "replay",
           "write_reproducer"]
