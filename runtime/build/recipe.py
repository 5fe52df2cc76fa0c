"""Controllers built from a `build.json` recipe: the libraries they use, wasi-libc, C sources from a
pinned PyPI sdist.

A recipe (JSON, in the controller's folder) says:

- ``"libs"``: the controller libraries (``controllers/lib/<name>``) compiled in, with their
  folders on the include path; a library's ``lib.json`` names the libraries it needs in turn
  (:func:`libs`). A recipe with only ``libs`` builds like a plain C controller (freestanding, the
  SDK, no libc).
- ``"libc": "wasi"`` (optional, the only libc): compile with ``-target wasm32-wasi`` and link wasi-libc, so
  the module imports a few `wasi_snapshot_preview1` functions (docs/wasi.md). The SDK's own
  `_initialize` stays the reactor entry (zig links the command start code all the same: see
  ``drop_exports``).
- ``"sdist"``: ``requirement`` (an exact ``name==version`` pin), ``sources`` and ``include``
  (paths inside the unpacked sdist) and ``cflags``. The sdist is fetched with
  ``pip download --no-binary :all: --no-deps <requirement>`` into the build cache, once, and
  never committed; each source compiles once per (content, flags, compiler) into a cached object,
  so a change to the controller's own files relinks in seconds.
- ``"sdk_exclude"``: SDK files left out (e.g. `aici_alloc.c`, whose malloc would clash with libc's).
- ``"stack_size"``: the shadow stack, bytes (default: the toolchain's).
- ``"exports"``: symbols the link exports besides the usual (``-Wl,--export=NAME``): e.g. the js
  controller's `aicirt_time_notice`, a data word the host writes (docs/protocol.md#limits).
- ``"drop_exports"``: exports removed from the linked module (e.g. wasi-libc's ``_start``: a
  reactor's `_initialize` is the SDK's, and nothing calls ``_start``).

Everything raises :class:`aicirt.build.sources.BuildError` with the tool's own output.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Callable

from ..paths import user_cache_dir
from .sources import C_FLAGS, CONTROLLERS_DIR, SDK_DIR, STACK_SIZE, BuildError, compiler_version, sdk_sources

RECIPE = "build.json"
LIB_RECIPE = "lib.json"
_PIN_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.=")


def find(path: Path) -> dict[str, Any] | None:
    """The folder's recipe, parsed and checked; None when it has none (a plain C/Zig build)."""
    f = path / RECIPE if path.is_dir() else None
    if f is None or not f.is_file():
        return None
    try:
        r = json.loads(f.read_text())
    except ValueError as e:
        raise BuildError(f"{f}: not valid JSON: {e}") from None
    if not isinstance(r, dict):
        raise BuildError(f"{f}: a recipe is a JSON object")
    if r.get("libc", "wasi") != "wasi":
        raise BuildError(f'{f}: "libc" can only be "wasi" (the only libc the toolchain builds against)')
    _check_libs(f, r.get("libs", []))
    sd = r.get("sdist")
    if sd is not None:
        req = sd.get("requirement", "") if isinstance(sd, dict) else ""
        if "==" not in req or not set(req) <= _PIN_CHARS:
            raise BuildError(f'{f}: "sdist.requirement" must pin one version, e.g. "quickjs-ng==0.17.0.2"')
        for key in ("sources", "include", "cflags"):
            if not all(isinstance(x, str) for x in sd.get(key, [])):
                raise BuildError(f'{f}: "sdist.{key}" must be a list of strings')
    for key in ("exports", "drop_exports"):
        if not all(isinstance(x, str) for x in r.get(key, [])):
            raise BuildError(f'{f}: "{key}" must be a list of strings')
    return r


def _lib_dir() -> Path:
    return CONTROLLERS_DIR / "lib"


def _check_libs(where: Path, names: Any) -> None:
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise BuildError(f'{where}: "libs" must be a list of library names')
    for n in names:
        if "/" in n or n.startswith(".") or not (_lib_dir() / n).is_dir():
            have = ", ".join(sorted(d.name for d in _lib_dir().iterdir() if d.is_dir())) if _lib_dir().is_dir() else ""
            raise BuildError(f"{where}: no controller library {n!r} (controllers/lib has: {have})")


def is_libc(recipe: dict[str, Any] | None) -> bool:
    """Whether the recipe builds against wasi-libc (else: freestanding, like a plain controller)."""
    return recipe is not None and recipe.get("libc") == "wasi"


def libs(recipe: dict[str, Any] | None) -> list[Path]:
    """The folders of the libraries a recipe names, with those they need (their `lib.json`),
    each once, a library after those it needs."""
    out: list[Path] = []

    def add(name: str, chain: tuple[str, ...]) -> None:
        d = _lib_dir() / name
        if d in out:
            return
        if name in chain:
            raise BuildError(f"controller libraries need each other in a circle: {' -> '.join(chain + (name,))}")
        f = d / LIB_RECIPE
        needs: list[str] = []
        if f.is_file():
            try:
                needs = json.loads(f.read_text()).get("libs", [])
            except (ValueError, AttributeError) as e:
                raise BuildError(f"{f}: not a JSON object: {e}") from None
            _check_libs(f, needs)
        for n in needs:
            add(n, chain + (name,))
        out.append(d)

    for name in (recipe or {}).get("libs", []):
        add(name, ())
    return out


def lib_sources(recipe: dict[str, Any] | None) -> tuple[list[Path], list[str]]:
    """The C sources of the recipe's libraries and the -I flags for their folders."""
    dirs = libs(recipe)
    return [c for d in dirs for c in sorted(d.glob("*.c"))], [f"-I{d}" for d in dirs]


def _cache() -> Path:
    return Path(os.environ.get("AICIRT_BUILD_CACHE") or user_cache_dir("builds"))


def fetch_sdist(requirement: str) -> Path:
    """The unpacked sdist of `requirement` (pip, once per pin, into the build cache)."""
    dest = _cache() / "sdist" / requirement.replace("==", "-")
    done = dest / ".unpacked"
    if done.is_file():
        return dest / done.read_text().strip()
    tmp = Path(tempfile.mkdtemp(prefix=".sdist-", dir=_cache()))
    try:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                            "-q", requirement, "-d", str(tmp)],
                           capture_output=True, text=True)
        archives = sorted(tmp.glob("*.tar.gz"))
        if r.returncode != 0 or not archives:
            raise BuildError(f"fetching the sdist {requirement} with pip failed:\n{(r.stderr + r.stdout).strip()}")
        with tarfile.open(archives[0]) as tf:
            tf.extractall(tmp / "src", filter="data")
        top = next((tmp / "src").iterdir())
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        os.replace(top, dest / top.name)
        done.write_text(top.name)
        return dest / top.name
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _zig() -> list[str]:
    return [sys.executable, "-m", "ziglang"]


def _objects(recipe: dict[str, Any], run: Callable, label: str, progress: bool) -> tuple[list[Path], list[str]]:
    """The sdist's sources as cached objects, and the -I flags for its headers."""
    sd = recipe.get("sdist")
    if not sd:
        return [], []
    root = fetch_sdist(sd["requirement"])
    includes = [f"-I{root / d}" for d in sd.get("include", [])]
    flags = ["-target", "wasm32-wasi", "-mbulk-memory", "-msimd128", "-g0", *sd.get("cflags", [])]
    objs = []
    for rel in sd.get("sources", []):
        src = root / rel
        if not src.is_file():
            raise BuildError(f"{sd['requirement']}: no source {rel} in the sdist")
        key = hashlib.sha256(" ".join([sd["requirement"], rel, *flags, compiler_version()]).encode()
                             + src.read_bytes()).hexdigest()[:16]
        obj = _cache() / "obj" / f"{src.stem}-{key}.o"
        if not obj.is_file():
            obj.parent.mkdir(parents=True, exist_ok=True)
            tmp = obj.with_suffix(f".{os.getpid()}.tmp")
            r = run([*_zig(), "cc", *flags, *includes, "-c", str(src), "-o", str(tmp)], f"{label}: {rel}", progress)
            if r.returncode != 0:
                tmp.unlink(missing_ok=True)
                raise BuildError((r.stderr + r.stdout).strip() or f"compiling {rel} failed")
            os.replace(tmp, obj)
        objs.append(obj)
    return objs, includes


def build(path: Path, out: Path, *, progress: bool, run: Callable) -> subprocess.CompletedProcess:
    """Compile and link the recipe folder `path` into `out`; the link's CompletedProcess."""
    recipe = find(path)
    assert recipe is not None
    objs, includes = _objects(recipe, run, path.name, progress)
    lib_cs, lib_includes = lib_sources(recipe)
    exclude = set(recipe.get("sdk_exclude", []))
    sdk = [str(s) for s in sdk_sources() if s.name not in exclude]
    stack = int(recipe.get("stack_size", STACK_SIZE))
    cmd = [*_zig(), "cc", "-target", "wasm32-wasi", *C_FLAGS, f"-I{SDK_DIR}", *lib_includes, *includes,
           "-nostartfiles", "-Wl,--no-entry", "-Wl,--strip-all", f"-Wl,-z,stack-size={stack}",
           *(f"-Wl,--export={x}" for x in recipe.get("exports", [])), "-o", str(out),
           *map(str, sorted(path.glob("*.c"))), *map(str, lib_cs), *sdk, *map(str, objs)]
    r = run(cmd, path.name, progress)
    drop = recipe.get("drop_exports", [])
    if r.returncode == 0 and drop:
        out.write_bytes(without_exports(out.read_bytes(), set(drop)))
    return r


def without_exports(wasm: bytes, names: set[str]) -> bytes:
    """`wasm` with the exports named in `names` removed (what they export stays, unexported):
    e.g. wasi-libc's `_start`, which the command start code exports and nothing here calls."""
    from ..loader.wasm_binary import leb, name_bytes, Reader, sections
    out = bytearray(wasm[:8])
    for sid, header, start, end in sections(wasm):
        if sid != 7:   # the export section
            out += wasm[header:end]
            continue
        r = Reader(wasm, start, end)
        kept = []
        for _ in range(r.leb(32)):
            name = r.name()
            kind = r.byte()
            index = r.leb(32)
            if name not in names:
                kept.append(name_bytes(name) + bytes([kind]) + leb(index))
        body = leb(len(kept)) + b"".join(kept)
        out += bytes([7]) + leb(len(body)) + body
    return bytes(out)


def source_hash(path: Path, compiler: str) -> str:
    """Everything the build reads: the recipe, the folder's C files and headers, its libraries'
    (and their `lib.json`), the SDK, the compiler's version (the sdist is pinned by the recipe).
    Named inputs, not a scan of `#include` lines: a library is a folder the recipe names."""
    h = hashlib.sha256(b"recipe-2\0" + compiler.encode())
    # *.js: files a C source #embeds (the js controller's lib.js)
    files = [*sorted(path.glob("*.[ch]")), *sorted(path.glob("*.js")), path / RECIPE,
             *sorted(SDK_DIR.glob("*.[ch]"))]
    for d in libs(find(path)):
        files += [*sorted(d.glob("*.[ch]")), *sorted(d.glob(LIB_RECIPE))]
    for f in files:
        h.update(f"{f.parent.name}/{f.name}".encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]
