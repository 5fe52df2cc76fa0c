"""What a test needs from outside the package: skipped where it is missing, except under CI.

CI (`CI=true`, as `.ci/run` sets it) installs the whole dev extra and a C compiler, so there a
missing tool is a broken install and must fail the run, not hide as a skip. Only what the dev
extra provides goes through here; the model extra (torch, transformers) stays optional.
"""
from __future__ import annotations

import importlib
import os
import shutil
from types import ModuleType

import pytest

IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing(what: str) -> None:
    """Skip the current test for a missing `what`, or fail it under CI."""
    if IN_CI:
        pytest.fail(f"CI requires {what}, which is missing (install the dev extra: pip install -e '.[dev]')",
                    pytrace=False)
    pytest.skip(f"{what} not installed")


def module(name: str) -> ModuleType:
    """Import `name` for a test module: a skip where it is missing, a collection error under CI."""
    if IN_CI:
        return importlib.import_module(name)
    return pytest.importorskip(name)


def tool(name: str) -> pytest.MarkDecorator:
    """Mark a test that runs the executable `name` (found on PATH): skipped, or failed under CI."""
    return pytest.mark.requires_tool(name)


def check_tools(item: pytest.Item) -> None:
    """`pytest_runtest_setup`'s half of `tool`."""
    for mark in item.iter_markers("requires_tool"):
        if shutil.which(mark.args[0]) is None:
            missing(f"`{mark.args[0]}` on PATH")
