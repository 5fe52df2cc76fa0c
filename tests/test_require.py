"""tests/_require.py: a missing tool skips a test on a developer's machine and fails it under CI."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

HERE = Path(__file__).resolve().parent


@pytest.fixture
def inner(pytester, monkeypatch):
    # The inner run needs only pytest and _require: without the installed plugins (aicirt's own,
    # which imports the runtime, hypothesis, ...) each subprocess starts in about a second, not 30 s at load 20.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makeconftest(f"import sys\nsys.path.insert(0, {str(HERE)!r})\nimport _require\n\n"
                          "def pytest_runtest_setup(item):\n    _require.check_tools(item)\n")
    pytester.makeini("[pytest]\nmarkers =\n    requires_tool(name): runs `name`\n")
    pytester.makepyfile(test_inner="import _require as require\n\n"
                        "@require.tool('aicirt-no-such-tool')\ndef test_tool():\n    pass\n\n"
                        "def test_module():\n    require.module('aicirt_no_such_module')\n")
    return pytester


@pytest.mark.parametrize("ci", ["", "false", "0"])
def test_missing_tool_skips_outside_ci(inner, monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    inner.runpytest_subprocess().assert_outcomes(skipped=2)


def test_missing_tool_fails_under_ci(inner, monkeypatch):
    monkeypatch.setenv("CI", "true")
    r = inner.runpytest_subprocess()
    r.assert_outcomes(failed=1, errors=1)          # the tool fails in setup, the import in the call
    assert r.ret != 0
    r.stdout.fnmatch_lines(["*CI requires `aicirt-no-such-tool` on PATH*"])
