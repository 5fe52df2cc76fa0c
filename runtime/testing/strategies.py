"""A Hypothesis strategy of fuzz plans, so Hypothesis generates (and shrinks) the engine's choices.

    from hypothesis import given
    from aicirt.testing import Fuzzer, plans

    fz = Fuzzer("digits.wasm")

    @given(plans())
    def test_digits(plan):
        fz.assert_plan(plan)          # AssertionError with the trace on a contract failure

A plan holds one choice stream per sequence label: "run" (capabilities and prompt), "0" (the
request's first sequence) and its forks "0.1" ... "0.<forks>"; labels not given read zeros.
Imports Hypothesis only when called.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .choices import CHOICE_LIMIT, Plan

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy


def plans(*, max_choices: int = 64, forks: int = 4, late_steps: bool = True) -> SearchStrategy[Plan]:
    """Plans with at most `max_choices` choices per stream."""
    from hypothesis import strategies as st

    stream = st.lists(st.integers(0, CHOICE_LIMIT - 1), max_size=max_choices)
    labels = ["run", "0", *(f"0.{i}" for i in range(1, forks + 1))]
    return st.builds(Plan, st.fixed_dictionaries({label: stream for label in labels}),
                     stream if late_steps else st.just([]))
