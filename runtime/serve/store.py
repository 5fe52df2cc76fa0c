"""The controller store: modules addressed by the sha256 of their Wasm, tags and metadata in SQLite.

Layout under the store's root (default `$AICIRT_STORE`, else `$XDG_DATA_HOME/aicirt/store`,
else `~/.local/share/aicirt/store`):

    store.sqlite                     tables `modules` and `tags` (schema below)
    modules/<sha256>.wasm            the module as uploaded (its name is its content's hash)
    modules/<sha256>-<key>.cwasm     the precompiled artifact, one per runtime configuration `key`
                                     (the runtime's own compile cache: `Runtime(cache_dir=root)`)
    tmp/                             uploads in progress and modules being removed

Guarantees (tests/test_store.py checks each, including `kill -9` mid-upload):
- a row in `modules` always has its `.wasm` file, whose sha256 is the row's id, because a file is
  renamed into place (`os.replace`, atomic) before the transaction that adds its row commits, and
  a removal moves the file out only inside the transaction that deletes the row;
- an upload is one transaction (module row and its tags), so a crash leaves all or none of it;
  a crash can at worst leave an unreferenced file behind, which `verify()` reports as harmless;
- writers serialise on SQLite's write lock (`BEGIN IMMEDIATE`, busy timeout), so several
  processes may upload the same or different modules at once; the slow part (validation and
  compilation) runs outside the lock.

`resolve_controller(spec)` is the one place that turns what a user names (a path, a C/Zig source,
a shipped name, a tag or a module id) into a `.wasm` path: the CLI, the server and other
engines' adapters call it. This module imports nothing beyond the standard library at import time.
"""
from __future__ import annotations

import getpass
import hashlib
import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

#: Default upload limit (docs/protocol.md#limits), the same as `aicirt.Limits().upload_bytes`.
MAX_UPLOAD_BYTES = 64 << 20
MAX_TAG_LENGTH = 50
_TAG_RE = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")
_MODULE_ID_RE = re.compile(r"[0-9a-f]{64}")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS modules (
    module_id     TEXT PRIMARY KEY,      -- sha256 of the Wasm, 64 lowercase hex digits
    wasm_size     INTEGER NOT NULL,      -- bytes
    compiled_size INTEGER NOT NULL,      -- bytes of the precompiled artifact
    created_at    INTEGER NOT NULL,      -- unix seconds
    created_by    TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS tags (
    tag        TEXT PRIMARY KEY,
    module_id  TEXT NOT NULL REFERENCES modules(module_id),
    updated_at INTEGER NOT NULL,
    updated_by TEXT NOT NULL
);
"""


_T = TypeVar("_T")


def _known(row: _T | None) -> _T:
    """A row read inside the transaction that just listed or wrote it: never missing."""
    if row is None:
        raise RuntimeError("a store row vanished inside its own transaction")
    return row


class StoreError(ValueError):
    """A request the store cannot satisfy; the message names the problem. `status`: the HTTP code."""
    status = 400


class NotFound(StoreError):
    status = 404


class TooLarge(StoreError):
    status = 413


def default_root() -> Path:
    """`$AICIRT_STORE`, else `$XDG_DATA_HOME/aicirt/store`, else `~/.local/share/aicirt/store`."""
    env = os.environ.get("AICIRT_STORE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base, "aicirt", "store")


def is_module_id(name: str) -> bool:
    return bool(_MODULE_ID_RE.fullmatch(name))


def validate_tag(tag: object) -> str:
    """`tag` if it is a valid tag name; raises `StoreError` saying why not."""
    if not isinstance(tag, str):
        raise StoreError(f"a tag must be a string, not {type(tag).__name__}")
    if re.fullmatch(r"[0-9a-fA-F]{64}", tag):
        raise StoreError(f"tag {tag!r}: 64 hex digits would read as a module id")
    if len(tag) > MAX_TAG_LENGTH:
        raise StoreError(f"tag {tag[:60]!r}: longer than {MAX_TAG_LENGTH} characters")
    if not _TAG_RE.fullmatch(tag):
        raise StoreError(f"tag {tag!r}: must start with a letter and contain only letters, digits, '_', '.' and '-'")
    return tag


def default_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no login name (containers): any label will do
        return "unknown"


@dataclass(frozen=True)
class ModuleInfo:
    module_id: str
    wasm_size: int
    compiled_size: int
    created_at: int
    created_by: str
    tags: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        d = asdict(self)
        d["tags"] = list(self.tags)
        return d


@dataclass(frozen=True)
class TagInfo:
    """AICI's TagInfo shape."""
    tag: str
    module_id: str
    updated_at: int
    updated_by: str
    wasm_size: int
    compiled_size: int

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Upload:
    """What `Store.put` did: AICI's upload response plus the tags now pointing at the module."""
    module_id: str
    wasm_size: int
    compiled_size: int
    time: int                              # milliseconds spent validating and compiling
    tags: tuple[TagInfo, ...] = ()

    def as_dict(self) -> dict:
        return {"module_id": self.module_id, "wasm_size": self.wasm_size, "compiled_size": self.compiled_size,
                "time": self.time, "tags": [t.as_dict() for t in self.tags]}


#: Validates and precompiles a module: Wasm bytes in, size of the precompiled artifact out.
#: Raises (typically `aicirt.LoadError`) for a module the runtime would not accept.
Compiler = Callable[[bytes], int]


class Store:
    """A controller store rooted at `root` (default: `default_root()`); created on first use.

    `compiler` validates and precompiles uploads (default: a runtime whose compile cache is this
    store's `modules/` folder, so servers over this store find the artifact ready). Every
    method opens its own SQLite connection, so one `Store` may be shared by threads.
    """

    def __init__(self, root: str | os.PathLike | None = None, *, compiler: Compiler | None = None,
                 max_upload_bytes: int = MAX_UPLOAD_BYTES):
        self.root = Path(root) if root is not None else default_root()
        self.modules_dir = self.root / "modules"
        self.tmp_dir = self.root / "tmp"
        self.db_path = self.root / "store.sqlite"
        self.max_upload_bytes = max_upload_bytes
        self._compiler = compiler
        self._ready = False

    @property
    def exists(self) -> bool:
        """Whether anything was ever stored here (reading never creates the store)."""
        return self.db_path.is_file()

    # --- connection ------------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        if not self._ready:
            self.modules_dir.mkdir(parents=True, exist_ok=True)
            self.tmp_dir.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(self.db_path, timeout=60, isolation_level=None)
        con.row_factory = sqlite3.Row
        con.execute("PRAGMA foreign_keys = ON")
        if not self._ready:
            with _write(con):
                for statement in _SCHEMA.split(";"):  # not executescript: it would COMMIT first
                    if statement.strip():
                        con.execute(statement)
                self._recover(con)
            self._ready = True
        return con

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        con = self._connect()
        try:
            yield con
        finally:
            con.close()

    def _recover(self, con: sqlite3.Connection) -> None:
        """Undo what a crashed removal left in tmp/ (under the write lock, so never a live one)."""
        for trash in self.tmp_dir.glob("*.removing"):
            module_id = trash.name.split(".", 1)[0]
            home = self.modules_dir / f"{module_id}.wasm"
            alive = con.execute("SELECT 1 FROM modules WHERE module_id = ?", (module_id,)).fetchone()
            try:
                if alive and not home.exists():
                    os.replace(trash, home)
                else:
                    trash.unlink()
            except FileNotFoundError:
                pass

    # --- writing ---------------------------------------------------------------------------
    def put(self, data: bytes, *, tags: Iterable[str] = (), user: str | None = None) -> Upload:
        """Store a module (validated and precompiled first) and point `tags` at it.

        Idempotent for the same bytes. Raises `TooLarge`, `StoreError` (bad tag, empty body) or
        whatever the compiler raises (`aicirt.LoadError`) for a module the runtime rejects;
        nothing is stored then.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise StoreError("a module must be bytes")
        data = bytes(data)
        if not data:
            raise StoreError("empty upload: the body must be the raw .wasm module")
        if len(data) > self.max_upload_bytes:
            raise TooLarge(f"{len(data)} bytes is over the upload limit of {self.max_upload_bytes}")
        tags = [validate_tag(t) for t in tags]
        user = user or default_user()
        module_id = hashlib.sha256(data).hexdigest()
        if not self._ready:
            self._connect().close()      # the folders and schema exist before any file is written
        t0 = time.perf_counter()
        try:
            compiled_size = self._compile(data)
        except BaseException:
            # The runtime caches compiled code before it validates: a rejected module leaves none.
            if self.lookup(module_id) is None:
                for artifact in self.modules_dir.glob(f"{module_id}-*.cwasm"):
                    artifact.unlink(missing_ok=True)
            raise
        ms = round((time.perf_counter() - t0) * 1e3)
        tmp = self.tmp_dir / f"{module_id}.{os.getpid()}.{time.monotonic_ns()}.upload"
        home = self.modules_dir / f"{module_id}.wasm"
        try:
            _write_file(tmp, data)
            with self._db() as con, _write(con):
                os.replace(tmp, home)   # same content whoever wins: replacing is harmless
                now = int(time.time())
                con.execute("INSERT INTO modules VALUES (?, ?, ?, ?, ?) ON CONFLICT(module_id) DO UPDATE SET "
                            "compiled_size = excluded.compiled_size",
                            (module_id, len(data), compiled_size, now, user))
                infos = self._set_tags(con, module_id, tags, user, now)
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(self.modules_dir)
        return Upload(module_id, len(data), compiled_size, ms, tuple(infos))

    def _compile(self, data: bytes) -> int:
        if self._compiler is None:
            self._compiler = RuntimeCompiler(self.root)
        return int(self._compiler(data))

    def tag(self, module_id: str, tags: Iterable[str], *, user: str | None = None) -> list[TagInfo]:
        """Point each of `tags` at `module_id` (moving tags that pointed elsewhere).

        Raises `NotFound` for an unknown module, `StoreError` for a bad tag name or no tags.
        """
        tags = [validate_tag(t) for t in tags]
        if not tags:
            raise StoreError("no tags given")
        module_id = self._check_id(module_id)
        with self._db() as con, _write(con):
            if not con.execute("SELECT 1 FROM modules WHERE module_id = ?", (module_id,)).fetchone():
                raise NotFound(f"unknown module id {module_id}")
            return self._set_tags(con, module_id, tags, user or default_user(), int(time.time()))

    def _set_tags(self, con: sqlite3.Connection, module_id: str, tags: list[str], user: str,
                  now: int) -> list[TagInfo]:
        for t in tags:
            con.execute("INSERT INTO tags VALUES (?, ?, ?, ?) ON CONFLICT(tag) DO UPDATE SET "
                        "module_id = excluded.module_id, updated_at = excluded.updated_at, "
                        "updated_by = excluded.updated_by", (t, module_id, now, user))
        return [_known(self._tag_info(con, t)) for t in tags]

    def remove_tag(self, tag: str) -> TagInfo:
        """Delete a tag (the module stays). Raises `NotFound`."""
        with self._db() as con, _write(con):
            info = self._tag_info(con, tag)
            if info is None:
                raise NotFound(f"unknown tag {tag!r}")
            con.execute("DELETE FROM tags WHERE tag = ?", (tag,))
            return info

    def remove_module(self, module_id: str) -> ModuleInfo:
        """Delete a module, its tags and its files. Raises `NotFound`."""
        module_id = self._check_id(module_id)
        with self._db() as con:
            with _write(con):
                info = self._module_info(con, module_id)
                if info is None:
                    raise NotFound(f"unknown module id {module_id}")
                con.execute("DELETE FROM tags WHERE module_id = ?", (module_id,))
                con.execute("DELETE FROM modules WHERE module_id = ?", (module_id,))
                # Out of sight inside the transaction: a crash before COMMIT is undone by _recover.
                trash = self.tmp_dir / f"{module_id}.removing"
                try:
                    os.replace(self.modules_dir / f"{module_id}.wasm", trash)
                except FileNotFoundError:
                    pass
            trash.unlink(missing_ok=True)
        for artifact in self.modules_dir.glob(f"{module_id}-*.cwasm"):
            artifact.unlink(missing_ok=True)
        return info

    def remove(self, name: str) -> ModuleInfo | TagInfo:
        """`aicirt rm NAME`: a module id removes the module (and its tags), a tag only the tag."""
        return self.remove_module(name) if is_module_id(name) else self.remove_tag(name)

    # --- reading ---------------------------------------------------------------------------
    def tags(self) -> list[TagInfo]:
        if not self.exists:
            return []
        with self._db() as con:
            rows = con.execute("SELECT tag FROM tags ORDER BY tag").fetchall()
            return [_known(self._tag_info(con, r["tag"])) for r in rows]

    def modules(self) -> list[ModuleInfo]:
        """Every module, in the order they were first stored (SQLite's rowid: a new row's is
        larger than every row's there, and re-uploading a stored module keeps its row), so the
        order is total and the same for any store that saw the same uploads: `created_at` is in
        whole seconds and would tie."""
        if not self.exists:
            return []
        with self._db() as con:
            rows = con.execute("SELECT module_id FROM modules ORDER BY rowid").fetchall()
            return [_known(self._module_info(con, r["module_id"])) for r in rows]

    def lookup(self, name: str) -> ModuleInfo | None:
        """The module a module id or a tag names; None when the store has neither."""
        if not self.exists:
            return None
        with self._db() as con:
            if is_module_id(name):
                return self._module_info(con, name)
            row = con.execute("SELECT module_id FROM tags WHERE tag = ?", (name,)).fetchone()
            return self._module_info(con, row["module_id"]) if row else None

    def wasm_path(self, module_id: str) -> Path:
        return self.modules_dir / f"{module_id}.wasm"

    def _check_id(self, module_id: object) -> str:
        if not isinstance(module_id, str) or not is_module_id(module_id):
            raise StoreError(f"module id {module_id!r}: must be 64 lowercase hex digits (sha256 of the module)")
        return module_id

    @staticmethod
    def _tag_info(con: sqlite3.Connection, tag: str) -> TagInfo | None:
        row = con.execute("SELECT t.tag, t.module_id, t.updated_at, t.updated_by, m.wasm_size, m.compiled_size "
                          "FROM tags t JOIN modules m USING (module_id) WHERE t.tag = ?", (tag,)).fetchone()
        return TagInfo(**dict(row)) if row else None

    @staticmethod
    def _module_info(con: sqlite3.Connection, module_id: str) -> ModuleInfo | None:
        row = con.execute("SELECT * FROM modules WHERE module_id = ?", (module_id,)).fetchone()
        if row is None:
            return None
        tags = tuple(r["tag"] for r in con.execute("SELECT tag FROM tags WHERE module_id = ? ORDER BY tag",
                                                   (module_id,)))
        return ModuleInfo(**dict(row), tags=tags)

    # --- consistency -----------------------------------------------------------------------
    def verify(self) -> tuple[list[str], list[str]]:
        """Check the store: (problems, harmless leftovers). A consistent store has no problems.

        Problems: SQLite integrity errors, a module row without its file or whose file does not
        hash to its id, a tag pointing at no module. Leftovers: unreferenced files a crash left.
        """
        problems, leftovers = [], []
        with self._db() as con:
            for (msg,) in con.execute("PRAGMA integrity_check"):
                if msg != "ok":
                    problems.append(f"sqlite: {msg}")
            known = set()
            for r in con.execute("SELECT module_id, wasm_size FROM modules"):
                known.add(r["module_id"])
                path = self.wasm_path(r["module_id"])
                if not path.is_file():
                    problems.append(f"module {r['module_id']}: file {path} is missing")
                    continue
                data = path.read_bytes()
                if hashlib.sha256(data).hexdigest() != r["module_id"] or len(data) != r["wasm_size"]:
                    problems.append(f"module {r['module_id']}: file {path} does not match its id or size")
            for r in con.execute("SELECT tag, module_id FROM tags WHERE module_id NOT IN "
                                 "(SELECT module_id FROM modules)"):
                problems.append(f"tag {r['tag']}: points at missing module {r['module_id']}")
        for path in sorted(self.modules_dir.glob("*.wasm")):
            if path.stem not in known:
                leftovers.append(str(path))
        leftovers += [str(p) for p in sorted(self.tmp_dir.iterdir())]
        return problems, leftovers


class RuntimeCompiler:
    """Validates and precompiles with a throwaway `aicirt.Runtime` whose compile cache is the
    store's `modules/` folder; its artifact is what a server over the same store deserializes."""

    def __init__(self, root: Path):
        self.root = root

    def __call__(self, data: bytes) -> int:
        from aicirt import ByteTokenizer, Runtime

        rt = Runtime(ByteTokenizer(), workers=1, cache_dir=self.root, max_sequences=1, prebuild_trie=False)
        try:
            return artifact_size(rt, rt.load(data))
        finally:
            rt.close()


def artifact_size(runtime: Any, controller: Any) -> int:
    """Bytes of `controller`'s precompiled artifact in `runtime`'s compile cache (serialized anew
    when the cache could not be written)."""
    if runtime.cache_dir is not None:
        path = Path(runtime.cache_dir) / f"{controller.sha256}-{runtime.engine_key}.cwasm"
        if path.is_file():
            return path.stat().st_size
    return len(controller.module.serialize())


@contextmanager
def _write(con: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction, taking SQLite's write lock up front (no upgrade deadlocks)."""
    con.execute("BEGIN IMMEDIATE")
    try:
        yield con
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --- naming a controller --------------------------------------------------------------------------
def resolve_controller(spec: str, store: Store | None = None, *, allow_paths: bool = True,
                       progress: bool = False, shipped_builds: dict | None = None) -> Path:
    """The `.wasm` file `spec` names, for the CLI, the server and other engines' adapters.

    In order: a module id (64 hex digits, from the store); with `allow_paths`, an existing
    `.wasm` file, or a C/Zig file or folder (built, cached); a tag in the store; the name of a
    shipped controller (built, cached). A server passes `allow_paths=False`: clients name only
    store entries and shipped controllers, never files on the server.

    `shipped_builds`: a memo of shipped controllers' builds (name -> path) for a long-lived
    caller such as a server, which then skips hashing their sources on every request.

    Raises `NotFound` naming what was tried, `aicirt.build.toolchain.BuildError` for a source that does
    not compile.
    """
    if not isinstance(spec, str) or not spec:
        raise StoreError("name a controller: a module id, a tag or a shipped controller")
    store = store if store is not None else Store()
    if is_module_id(spec):
        if store.lookup(spec) is None:
            raise NotFound(f"unknown module id {spec} (not in the store at {store.root})")
        return store.wasm_path(spec)
    if allow_paths:
        path = Path(spec)
        if path.suffix == ".wasm" and path.is_file():
            return path
        if path.suffix == ".wasm":
            raise NotFound(f"{spec}: no such file")
        if path.exists():
            from aicirt.build import toolchain

            return Path(toolchain.build_cached(path, progress=progress))
    info = store.lookup(spec) if _TAG_RE.fullmatch(spec) else None
    if info is not None:
        return store.wasm_path(info.module_id)
    if shipped_builds is not None and spec in shipped_builds:
        return shipped_builds[spec]
    from aicirt.build import toolchain

    shipped = toolchain.shipped_controllers()
    if spec in shipped:
        path = Path(toolchain.build_cached(toolchain.CONTROLLERS_DIR / spec, progress=progress))
        if shipped_builds is not None:
            shipped_builds[spec] = path
        return path
    what = "a file, a tag, a module id" if allow_paths else "a tag, a module id"
    raise NotFound(f"{spec!r} is not {what} or a shipped controller ({', '.join(shipped)})")
