"""The wheel carries what a build needs (SDK, shipped controllers, wit/) and the CLI inside the
package: `pip install .` works from any folder, with no top-level `cli` module."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


# Building the wheel takes ~10-25 s: `make test-slow` builds one, and CI runs these tests on the
# wheel its packaging stage built (AICIRT_TEST_WHEEL, `.ci/run`).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    given = os.environ.get("AICIRT_TEST_WHEEL")
    if given:
        return zipfile.ZipFile(given)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check",
                    "-w", str(out), str(ROOT)], check=True, capture_output=True)
    (whl,) = out.glob("aicirt-*.whl")
    return zipfile.ZipFile(whl)


def test_every_subpackage_of_runtime_ships(wheel):
    names = set(wheel.namelist())
    packages = sorted(p.parent.relative_to(ROOT / "runtime") for p in (ROOT / "runtime").rglob("__init__.py"))
    assert packages, "no packages found under runtime/"
    for rel in packages:
        assert str(Path("aicirt", rel, "__init__.py")) in names, rel


def test_sdk_controllers_and_wit_are_package_data(wheel):
    names = set(wheel.namelist())
    for sub in ("controllers", "wit"):
        for f in (ROOT / sub).rglob("*"):
            if f.is_file() and f.suffix in {".c", ".h", ".zig", ".md", ".wit"}:
                assert f"aicirt/_data/{f.relative_to(ROOT).as_posix()}" in names, f
    assert "aicirt/py.typed" in names and "aicirt/native/step.c" in names


def test_cli_is_inside_the_package(wheel):
    names = set(wheel.namelist())
    assert not any(n in ("cli.py", "cli/__init__.py") for n in names)
    assert wheel.read("aicirt/cli/main.py") == (ROOT / "cli.py").read_bytes()   # a copy, not a link
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "aicirt = aicirt.cli.main:main" in wheel.read(entry).decode()
