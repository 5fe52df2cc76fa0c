"""The tree's layers: every import edge inside `runtime/` (the `aicirt` package) goes to the same
layer or one below it, so the tree reads bottom-up; and the runtime core never imports the engine."""
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


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (annotations only: no edge at run time)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out.update(id(n) for b in node.body for n in ast.walk(b))
    return out


def imported_modules(path: Path, runtime_only: bool = False) -> set[str]:
    """Absolute names of what `path` imports, relative imports resolved within `aicirt` (lazy
    imports inside functions included; with `runtime_only`, those under TYPE_CHECKING left out)."""
    package = ["aicirt"] + list(path.parent.relative_to(RUNTIME).parts)
    names = set()
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_only(tree) if runtime_only else set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
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


# The intended layers, bottom first (docs: README "Where things are"). A module may import its own
# layer and those below; a package (`native/`, `engine/`, ...) is one unit, and imports between the
# modules of one layer are free. A module not listed fails the test: place it when you add it.
LAYERS: list[tuple[str, set[str]]] = [
    ("base: the contract and plain values", {
        "abi", "capabilities", "errors", "limits", "paths", "owned", "tokenizer", "toktrie", "wasm_binary",
        "wasm_code", "admission", "js_bind"}),
    ("native: the hot path and the host imports' C side", {"native", "wasi"}),
    ("loader: modules in, snapshots", {"controller", "snapshot", "compile_worker"}),
    ("core: runtime, batch step, sequences", {
        "runtime", "batch", "sequence", "request", "results", "lift", "registry", "host_imports", "memory"}),
    ("build: the toolchain and recipes", {"toolchain", "recipe"}),
    ("package surface", {"__init__"}),
    ("engine", {"engine"}),
    ("above the engine: CLI pieces, programs, the fuzzer", {"arg_check", "run_command", "program", "testing"}),
    ("serve", {"serve"}),
    ("integrations: engines aicirt plugs into", {"integrations"}),
    ("the CLI", {"_cli"}),
]
LAYER_OF = {unit: i for i, (_, units) in enumerate(LAYERS) for unit in units}


def unit_of(module: str) -> str:
    """The layer unit of a module name: `aicirt.native.pool` -> `native`; the package itself -> `__init__`."""
    parts = module.split(".")
    return "__init__" if len(parts) == 1 or parts[1] == "__init__" else parts[1]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(RUNTIME).with_suffix("").parts)
    return ".".join(["aicirt"] + parts)


def import_edges() -> list[tuple[str, str]]:
    """(importer, imported) module names for every import inside the package, at run time.
    `from . import abi` is an edge to `aicirt.abi`, `from .abi import X` too, `from . import Name`
    (a name the package defines) one to the package."""
    modules = {module_name(p) for p in RUNTIME.rglob("*.py")}
    modules |= {m[:-len(".__init__")] for m in modules if m.endswith(".__init__")}

    def owner(name: str) -> str:
        while name not in modules and "." in name:     # `aicirt.abi.HOST_MODULE` -> `aicirt.abi`
            name = name.rsplit(".", 1)[0]
        return name

    edges = []
    for p in sorted(RUNTIME.rglob("*.py")):
        package = ["aicirt"] + list(p.parent.relative_to(RUNTIME).parts)
        tree = ast.parse(p.read_text(), str(p))
        skip = _type_checking_only(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                mod = ".".join(base + ([node.module] if node.module else []))
                targets = [f"{mod}.{a.name}" for a in node.names]
            else:
                continue
            edges += [(module_name(p), owner(t)) for t in targets if t == "aicirt" or t.startswith("aicirt.")]
    return edges


def test_every_runtime_module_has_a_layer():
    units = {unit_of(module_name(p)) for p in RUNTIME.rglob("*.py")}
    assert units - set(LAYER_OF) == set(), "place these in LAYERS"
    assert set(LAYER_OF) - units == set(), "LAYERS names units that no longer exist"


def test_every_import_edge_goes_down_or_sideways():
    edges = import_edges()
    assert len(edges) > 200          # the walk sees the package (relative and lazy imports included)
    upward = sorted(f"{a} ({LAYERS[LAYER_OF[unit_of(a)]][0]}) imports {b} ({LAYERS[LAYER_OF[unit_of(b)]][0]})"
                    for a, b in edges if LAYER_OF[unit_of(b)] > LAYER_OF[unit_of(a)])
    assert upward == []


def test_the_layer_check_catches_an_upward_edge(tmp_path):
    """The check is not vacuous: an edge from the core to the engine is reported as upward."""
    assert LAYER_OF[unit_of("aicirt.engine.engine")] > LAYER_OF[unit_of("aicirt.runtime")]
    assert LAYER_OF[unit_of("aicirt.serve.app")] > LAYER_OF[unit_of("aicirt.program.builder")]
    assert ("aicirt.native.instance", "aicirt.controller") not in import_edges()   # TYPE_CHECKING only
