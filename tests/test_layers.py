"""The tree's layers: every import edge inside `runtime/` (the `aicirt` package) goes to the same
layer or one below it, so the tree reads bottom-up; and the runtime core never imports the engine."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

RUNTIME = Path(__file__).resolve().parent.parent / "runtime"
# The packages below the engine (with the plain-value modules at the top of runtime/): the core.
CORE_PACKAGES = ("native", "host", "loader", "core", "build")


def core_modules() -> list[Path]:
    top = list(RUNTIME.glob("*.py"))
    return sorted(top + [p for pkg in CORE_PACKAGES for p in (RUNTIME / pkg).glob("*.py")])


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
    assert "aicirt.engine.backends.load_backend" in imported_modules(RUNTIME / "runner" / "run.py")


def test_import_aicirt_loads_no_engine_and_no_model_framework():
    code = ("import sys, aicirt; bad = [m for m in sys.modules if m.startswith('aicirt.engine') "
            "or m.split('.')[0] in ('torch', 'transformers', 'llama_cpp')]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# -- the core untangled: no import circle, no private reaches across modules --------------------
def _module_name(path: Path) -> str:
    parts = ["aicirt", *path.relative_to(RUNTIME).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(path: Path, names: set[str]) -> set[str]:
    """The modules of `names` that `path` imports when it runs: at module level or inside a
    function (a local import breaks a circle at import time, not in the design), never under
    `if TYPE_CHECKING:`."""
    package = ["aicirt", *path.parent.relative_to(RUNTIME).parts]
    me, out = _module_name(path), set()

    def visit(node: ast.AST, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            tc = typing_only or (isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test))
            if not tc and isinstance(child, ast.Import):
                found = [a.name for a in child.names]
            elif not tc and isinstance(child, ast.ImportFrom):
                base = package[:len(package) - child.level + 1] if child.level else []
                mod = ".".join(base + ([child.module] if child.module else []))
                subs = [f"{mod}.{a.name}" for a in child.names if f"{mod}.{a.name}" in names]
                found = subs + ([mod] if len(subs) < len(child.names) else [])
            else:
                found = []
            for name in found:
                while name and name not in names:
                    name = name.rpartition(".")[0]
                if name and name != me:
                    out.add(name)
            visit(child, tc)

    visit(ast.parse(path.read_text(), str(path)), False)
    return out


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


# Known circles (none today: `toolchain` and `recipe` both build on `build.sources`); an entry
# names a circle's modules, sorted.
KNOWN_CIRCLES: list[list[str]] = []
# Known edges that close a circle (none today; an entry names (importer, imported)).
KNOWN_EDGES: set[tuple[str, str]] = set()


def test_no_import_circle_among_the_core_modules():
    paths = {_module_name(p): p for p in core_modules()}
    graph = {name: {m for m in _runtime_imports(p, set(paths)) if (name, m) not in KNOWN_EDGES}
             for name, p in paths.items()}
    assert "aicirt.native.compiled" in graph["aicirt.native"]   # the check sees package-relative imports
    assert [c for c in _circles(graph) if c not in KNOWN_CIRCLES] == []


def test_the_circle_check_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# Private names one core module still takes from another, in files other issues own; each is
# debt to pay by making the name public where it is defined. The runtime's own files (batch.py,
# runtime.py, registry.py, lift.py, native/) reach none.
KNOWN_PRIVATE_REACHES = {
    ("loader/snapshot.py", "_RULES"), ("loader/snapshot.py", "_compiled"), ("loader/snapshot.py", "_recall"),
    ("core/sequence.py", "_adopt"),
}


def _private_reaches(path: Path, core_privates: dict[str, set[Path]]) -> set[str]:
    """Private names (one leading underscore) `path` imports from another core module, or reads
    as an attribute of something other than self / cls where only another core module defines it."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("aicirt")):
            out.update(a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__"))
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owners = core_privates.get(node.attr, set())
            if owners and path not in owners and ast.unparse(node.value) not in ("self", "cls"):
                out.add(node.attr)
    return out


def _defined_privates() -> dict[str, set[Path]]:
    """Each private name a core module defines (functions, classes, methods, self attributes) ->
    the modules that define it."""
    out: dict[str, set[Path]] = {}
    for p in core_modules():
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            name = None
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = node.name
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and ast.unparse(node.value) == "self":
                name = node.attr
            if name and name.startswith("_") and not name.startswith("__"):
                out.setdefault(name, set()).add(p)
    return out


def test_no_private_reaches_across_core_modules():
    privates = _defined_privates()
    found = {(p.relative_to(RUNTIME).as_posix(), name) for p in core_modules() for name in _private_reaches(p, privates)}
    assert found - KNOWN_PRIVATE_REACHES == set()
    # batch.py drives Sequence through its public transitions only
    assert _private_reaches(RUNTIME / "core" / "batch.py", privates) == set()


# The intended layers, bottom first (docs: README "Where things are"). A module may import its own
# layer and those below; a package (`native/`, `engine/`, ...) is one unit, and imports between the
# modules of one layer are free. A module not listed fails the test: place it when you add it.
LAYERS: list[tuple[str, set[str]]] = [
    ("base: the contract and plain values", {"abi", "capabilities", "errors", "limits", "paths", "owned"}),
    ("native: the hot path in C and its cffi seam", {"native"}),
    ("host: the imports a controller is granted, WASI, the tokenizer", {"host"}),
    ("loader: modules in, checks, admission, snapshots", {"loader"}),
    ("core: runtime, batch step, sequences, memory", {"core"}),
    ("build: the toolchain and recipes", {"build"}),
    ("package surface", {"__init__"}),
    ("engine", {"engine"}),
    ("above the engine: running a controller on it, programs, the fuzzer", {"runner", "program", "testing"}),
    ("serve", {"serve"}),
    ("integrations: engines aicirt plugs into", {"integrations"}),
    ("the CLI", {"cli"}),
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
    assert LAYER_OF[unit_of("aicirt.engine.engine")] > LAYER_OF[unit_of("aicirt.core.runtime")]
    assert LAYER_OF[unit_of("aicirt.serve.app")] > LAYER_OF[unit_of("aicirt.program.builder")]
    assert ("aicirt.native.instance", "aicirt.loader.controller") not in import_edges()   # TYPE_CHECKING only


def test_every_package_folder_is_a_package_git_tracks():
    """Every folder of runtime/ holding modules has an `__init__.py` in the tree: without one it
    still imports from a checkout (a namespace package) but setuptools leaves it out of a wheel
    (an ignore rule once kept runtime/build/__init__.py out of git)."""
    tracked = set(subprocess.run(["git", "ls-files", "runtime"], cwd=RUNTIME.parent, capture_output=True, text=True,
                                 check=True).stdout.split())
    folders = {p.parent for p in RUNTIME.rglob("*.py") if "__pycache__" not in p.parts}
    missing = sorted(str((f / "__init__.py").relative_to(RUNTIME.parent)) for f in folders
                     if str((f / "__init__.py").relative_to(RUNTIME.parent)) not in tracked)
    assert missing == []
