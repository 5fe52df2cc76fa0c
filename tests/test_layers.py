"""The tree's layers: the runtime core never imports the engine above it."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

RUNTIME = Path(__file__).resolve().parent.parent / "runtime"
# Modules beside the core that sit above the engine: they drive it.
ABOVE_THE_ENGINE = {"testing.py", "run_command.py", "arg_check.py", "_cli.py"}


def core_modules() -> list[Path]:
    top = [p for p in RUNTIME.glob("*.py") if p.name not in ABOVE_THE_ENGINE]
    return sorted(top + list((RUNTIME / "native").glob("*.py")))


def imported_modules(path: Path) -> set[str]:
    """Absolute names of what `path` imports, relative imports resolved within `aicirt`."""
    package = ["aicirt"] + list(path.parent.relative_to(RUNTIME).parts)
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            names.add(mod)
            names.update(f"{mod}.{a.name}" for a in node.names)
    return names


def test_the_runtime_core_never_imports_the_engine():
    assert len(core_modules()) > 10
    offenders = {p.relative_to(RUNTIME).as_posix(): sorted(n for n in imported_modules(p)
                                                           if n == "aicirt.engine" or n.startswith("aicirt.engine."))
                 for p in core_modules()}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_import_check_sees_relative_imports():
    assert "aicirt.engine.Engine" in imported_modules(RUNTIME / "testing" / "model_fuzz.py")
    assert "aicirt.engine.backends.load_backend" in imported_modules(RUNTIME / "run_command.py")


def test_import_aicirt_loads_no_engine_and_no_model_framework():
    code = ("import sys, aicirt; bad = [m for m in sys.modules if m.startswith('aicirt.engine') "
            "or m.split('.')[0] in ('torch', 'transformers', 'llama_cpp')]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
