"""`aicirt build`: C / Zig controller source -> a checked controller module, with PyPI's `ziglang`.

Controllers link the libc-free C SDK (controllers/sdk), so a build needs no wasi-libc (no
one-off libc compile, no WASI imports) and the module is a plain core module whose only imports
are the host's. Zig sources get the SDK's C files plus the `aici` Zig module (sdk/aici.zig).

A controller folder may have a `build.json` recipe (:mod:`aicirt.build.recipe`). Its ``"libs"`` name
the controller libraries compiled in (``controllers/lib/<name>``: shared C code such as the JSON
Schema matcher, on the include path). A recipe with ``"libc": "wasi"`` (the shipped `js`) builds
against wasi-libc (its module imports a few WASI functions, which the runtime supplies:
docs/wasi.md), with C sources from a pinned PyPI sdist fetched by pip into the build cache,
compiled once per content into cached objects.

A `.js` file builds into the shipped `js` controller with that script bound in (aicirt.loader.js_bind,
docs/js.md).
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..paths import user_cache_dir
from .sources import (C_FLAGS, CONTROLLERS_DIR, DATA_DIR, LINK_FLAGS, NOT_CONTROLLERS, SDK_DIR, STACK_SIZE,
                      WIT_DIR, BuildError, compiler_version, sdk_sources)

__all__ = ["C_FLAGS", "CONTROLLERS_DIR", "DATA_DIR", "LINK_FLAGS", "NOT_CONTROLLERS", "SDK_DIR", "STACK_SIZE",
           "WIT_DIR", "BuildError", "BuildResult", "build", "build_cached", "check_module", "checked_script",
           "compile_command", "compiler_version", "resolve", "sdk_sources", "shipped_controllers", "source_hash"]

@dataclass
class BuildResult:
    path: Path
    size: int
    seconds: float


def resolve(src: str | os.PathLike) -> Path:
    """A file, a folder, or the name of a shipped controller (`controllers/<name>`)."""
    p = Path(src)
    if p.exists():
        return p
    shipped = CONTROLLERS_DIR / str(src)
    if os.sep not in str(src) and shipped.is_dir() and shipped.name not in NOT_CONTROLLERS:
        return shipped
    names = ", ".join(shipped_controllers())
    raise BuildError(f"{src}: no such file or folder (shipped controllers: {names})")


def shipped_controllers() -> list[str]:
    if not CONTROLLERS_DIR.is_dir():
        return []
    return sorted(d.name for d in CONTROLLERS_DIR.iterdir() if d.is_dir() and d.name not in NOT_CONTROLLERS)


def _sources(path: Path) -> tuple[list[Path], list[Path]]:
    """(C files, Zig files) of a source file or controller folder."""
    if path.is_dir():
        cs, zs = sorted(path.glob("*.c")), sorted(path.glob("*.zig"))
        if not cs and not zs:
            raise BuildError(f"{path}: no .c or .zig sources")
        return cs, zs
    if path.suffix == ".c":
        return [path], []
    if path.suffix == ".zig":
        return [], [path]
    raise BuildError(f"{path}: expected a .c, .zig, .js or .ts file, or a controller folder")


_ZIG_OPTIONAL = re.compile(r"\bexport\s+fn\s+(aicirt_init|aicirt_prepare|aicirt_prepare_template)\s*\(")   # the optional exports


def compile_command(path: Path, out: Path, sdk: bool = True) -> list[str]:
    """The compiler command line. `sdk=False` (C only) links nothing but the given sources: for
    controllers that write their own canonical-ABI glue (cabi_realloc, mid-process)."""
    from . import recipe
    cs, zs = _sources(path)
    zig = [sys.executable, "-m", "ziglang"]
    sdk_files = [str(s) for s in sdk_sources()] if sdk else []
    lib_cs, lib_includes = recipe.lib_sources(recipe.find(path))
    if zs and not sdk:
        raise BuildError(f"{path}: Zig controllers build with the SDK")
    if not zs:
        return [*zig, "cc", "-target", "wasm32-freestanding", "-nostdlib", *C_FLAGS,
                f"-I{SDK_DIR}", *lib_includes, *LINK_FLAGS, "-o", str(out),
                *map(str, sorted([*cs, *lib_cs], key=lambda f: (f.name, str(f)))), *sdk_files]
    if lib_cs:
        raise BuildError(f"{path}: controller libraries are C, for C controllers")
    if len(zs) > 1 and not any(z.name == "main.zig" for z in zs):
        raise BuildError(f"{path}: several .zig files and no main.zig")
    root = next((z for z in zs if z.name == "main.zig"), zs[0])
    target = ["-target", "wasm32-freestanding", "-O", "ReleaseSmall"]
    # A Zig `export fn` reaches the wasm exports only if the linker is told (Zig has no C-style
    # export_name attribute; -rdynamic would export aici_step and __stack_pointer too), so the
    # optional per-tokenizer init and per-argument prepare are named when a source defines them (a
    # match only in a comment fails the link: "symbol exported via --export not found: aicirt_init").
    init = sorted({f"--export={m}" for z in zs for m in _ZIG_OPTIONAL.findall(z.read_text(errors="replace"))})
    # Zig CLI: flags and C files before -M<name> belong to that module.
    return [*zig, "build-exe", "-fno-entry", "-fstrip", *init, f"-femit-bin={out}", "--stack", str(STACK_SIZE),
            *target, "-mcpu=generic+bulk_memory+simd128", f"-I{SDK_DIR}", "-cflags", *C_FLAGS, "--",
            *sdk_files, *map(str, cs), "--dep", "aici", f"-Mroot={root}",
            *target, f"-Maici={SDK_DIR / 'aici.zig'}"]


def _run(cmd: list[str], label: str, progress: bool) -> subprocess.CompletedProcess:
    """Run the compiler. Past one second, show that it is working: a spinner with the elapsed
    time on a terminal, one line otherwise (a cold Zig cache compiles Zig's std and compiler-rt
    for wasm32 once, a few seconds; the SDK needs no wasi-libc, so there is no libc build)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    box: dict = {}
    reader = threading.Thread(target=lambda: box.update(zip(("out", "err"), proc.communicate())))
    reader.start()
    t0, shown, tty = time.monotonic(), False, sys.stderr.isatty()
    spin = "|/-\\"
    while reader.is_alive():
        reader.join(0.2)
        dt = time.monotonic() - t0
        if not progress or dt < 1.0 or not reader.is_alive():
            continue
        if tty:
            sys.stderr.write(f"\r{spin[int(dt * 5) % 4]} compiling {label}  {dt:4.1f} s")
            sys.stderr.flush()
        elif not shown:
            print(f"aicirt build: compiling {label} (a cold compiler cache takes a few seconds)...",
                  file=sys.stderr, flush=True)
        shown = True
    if shown and tty:
        sys.stderr.write("\r" + " " * (len(label) + 24) + "\r")
        sys.stderr.flush()
    return subprocess.CompletedProcess(cmd, proc.returncode, box.get("out", ""), box.get("err", ""))


def check_module(wasm: bytes, name: str, compile_timeout_s: float = 30.0) -> None:
    """Validate against the contract (docs/protocol.md#wit) with the runtime's own checker (it compiles the
    module, within `compile_timeout_s` of wall-clock time)."""
    from ..loader.controller import check_controller
    from ..errors import LoadError
    try:
        check_controller(wasm, compile_timeout_s=compile_timeout_s)
    except LoadError as e:
        raise BuildError(str(e).replace("<bytes>", name, 1)) from None


def _hint(stderr: str) -> str:
    if "undefined symbol: aici_step" in stderr:
        return ("\nhint: a controller defines `void aici_step(const aici_arg_t *arg, aici_result_t *res)` "
                "(Zig: `export fn aici_step(...)`); see docs/writing-controllers.md")
    return ""


def build(src: str | os.PathLike, out: Path | None = None, *, progress: bool = True, sdk: bool = True) -> BuildResult:
    """Compile a C file, a Zig file, a controller folder or a shipped controller's name.

    `out` defaults to `<name>.wasm` in the current directory. Raises BuildError with the
    compiler's diagnostics, or naming the contract violation (e.g. a missing `mid-process`).
    """
    path = resolve(src)
    name = path.stem if path.is_file() else path.resolve().name
    out = Path(out) if out is not None else Path.cwd() / f"{name}.wasm"
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")   # unique per build
    os.close(fd)
    tmp = Path(tmp_name)
    t0 = time.monotonic()
    try:
        from . import recipe
        if path.suffix in (".js", ".ts"):   # a script: the js controller with it bound in (js_bind.py)
            r = _bind_script(path, tmp, progress)
        elif recipe.is_libc(recipe.find(path)):   # a build.json folder on wasi-libc, an sdist's sources
            r = recipe.build(path, tmp, progress=progress, run=_run)
        else:
            r = _run(compile_command(path, tmp, sdk), path.name, progress)
        if r.returncode != 0:
            diag = (r.stderr + r.stdout).strip() or f"compiler exited with status {r.returncode}"
            raise BuildError(diag + _hint(diag))
        wasm = tmp.read_bytes()
        # a libc-built module (QuickJS: 1 MiB, ~10 s of CPU to compile) gets the build's patience,
        # not a request's: a loaded machine stretches the compile's wall-clock time
        big = path.suffix in (".js", ".ts") or recipe.is_libc(recipe.find(path))
        check_module(wasm, out.name, 300.0 if big else 30.0)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return BuildResult(out, len(wasm), time.monotonic() - t0)


def checked_script(path: Path, js: bytes | None = None) -> bytes:
    """A script file as the js controller will run it: a `.ts` file's types stripped (every line
    kept where it was), then parsed, running none of it. `js`: the js controller's module (built
    from the caches when not given). Raises ValueError "FILE:LINE:COL: ..." for one that does not
    parse."""
    from .js_tools import TS_STRIPPER, check_script, strip_types
    if js is None:
        js = build_cached(CONTROLLERS_DIR / "js", progress=False).read_bytes()
    script = path.read_bytes()
    if path.suffix == ".ts":
        script = strip_types(js, (CONTROLLERS_DIR / "js" / TS_STRIPPER).read_bytes(), script, str(path))
    check_script(js, script, str(path))
    return script


def _bind_script(path: Path, out: Path, progress: bool) -> subprocess.CompletedProcess:
    """A JavaScript file -> the shipped js controller with the script bound in (aicirt.loader.js_bind);
    a TypeScript file's types stripped first. The script is parsed first (`checked_script`): a
    syntax error fails the build, naming its line and column."""
    from ..loader.js_bind import bind
    from ..loader.wasm_binary import WasmFormatError
    js = build_cached(CONTROLLERS_DIR / "js", progress=progress).read_bytes()
    try:
        script = checked_script(path, js)
    except ValueError as e:   # names the file, line and column
        return subprocess.CompletedProcess([], 1, "", str(e))
    try:
        out.write_bytes(bind(js, script))
    except (ValueError, WasmFormatError) as e:
        return subprocess.CompletedProcess([], 1, "", f"{path}: {e}")
    return subprocess.CompletedProcess([], 0, "", "")


def source_hash(src: str | os.PathLike, sdk: bool = True) -> str:
    """Hash of everything a build reads: the sources and the headers beside them, the SDK, the
    compiler's version and the compile command's shape."""
    path = resolve(src)
    from . import recipe
    if path.suffix in (".js", ".ts"):
        from .js_tools import TS_STRIPPER
        h = hashlib.sha256(b"js-bind-3\0" + source_hash(CONTROLLERS_DIR / "js").encode() + path.suffix.encode())
        if path.suffix == ".ts":
            h.update((CONTROLLERS_DIR / "js" / TS_STRIPPER).read_bytes())
        return hashlib.sha256(h.digest() + path.read_bytes()).hexdigest()[:16]
    found = recipe.find(path)
    if recipe.is_libc(found):
        return recipe.source_hash(path, compiler_version())
    cs, zs = _sources(path)
    headers = sorted((path if path.is_dir() else path.parent).glob("*.h"))
    h = hashlib.sha256(" ".join(compile_command(path, Path("OUT"), sdk)).encode())
    h.update(compiler_version().encode())
    for f in [*cs, *zs, *headers, *sorted(SDK_DIR.glob("*.[ch]")), SDK_DIR / "aici.zig"]:
        if f.exists():
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    if found is not None:     # the recipe and its libraries' files (named inputs, no include scan)
        h.update(recipe.source_hash(path, compiler_version()).encode())
    return h.hexdigest()[:16]


def build_cached(src: str | os.PathLike, cache_dir: Path | None = None, *, progress: bool = False,
                 sdk: bool = True) -> Path:
    """Build once per source content: `<cache_dir>/<name>-<hash>.wasm` (default: user cache)."""
    path = resolve(src)
    name = path.stem if path.is_file() else path.resolve().name
    cache_dir = Path(cache_dir or os.environ.get("AICIRT_BUILD_CACHE") or user_cache_dir("builds"))
    out = cache_dir / f"{name}-{source_hash(path, sdk)}.wasm"
    if not out.exists():
        build(path, out, progress=progress, sdk=sdk)
    return out
