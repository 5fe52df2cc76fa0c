"""The controller store: content addressing, tags, validation, crash safety, concurrent writers."""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _store_helpers import variant

from aicirt import LoadError
from aicirt.serve.store import NotFound, Store, StoreError, TooLarge, resolve_controller, validate_tag

HERE = Path(__file__).resolve().parent


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(tmp_path / "store")


@pytest.fixture(scope="module")
def wasm(scripted_wasm) -> bytes:
    return scripted_wasm.read_bytes()


def test_put_is_content_addressed_with_precompiled_artifact(store, wasm):
    up = store.put(wasm, tags=["scripted"], user="alice")
    assert up.module_id == hashlib.sha256(wasm).hexdigest()
    assert up.wasm_size == len(wasm) and up.compiled_size > 0 and up.time >= 0
    assert store.wasm_path(up.module_id).read_bytes() == wasm
    artifacts = list(store.modules_dir.glob(f"{up.module_id}-*.cwasm"))
    assert len(artifacts) == 1 and artifacts[0].stat().st_size == up.compiled_size
    [tag] = up.tags
    assert (tag.tag, tag.module_id, tag.updated_by, tag.wasm_size) == ("scripted", up.module_id, "alice", len(wasm))
    again = store.put(wasm, user="bob")            # idempotent: same id, creator kept
    assert again.module_id == up.module_id
    [m] = store.modules()
    assert m.created_by == "alice" and m.tags == ("scripted",)
    assert store.verify() == ([], [])


def test_modules_are_listed_in_the_order_stored_even_within_one_second(store, wasm, monkeypatch):
    """`ls` order is total: modules stored within the same second (created_at ties) keep the
    order they were stored in, whatever their ids, and re-storing one does not move it."""
    import aicirt.serve.store as store_module

    monkeypatch.setattr(store_module.time, "time", lambda: 1_700_000_000.0)   # every upload in one second
    blobs = sorted((variant(wasm, k) for k in range(6)), key=lambda b: hashlib.sha256(b).hexdigest(), reverse=True)
    ids = [store.put(b).module_id for b in blobs]       # ids in descending order: a tie-break by id reverses them
    store.put(blobs[0])                                  # stored again: keeps its place
    assert [m.module_id for m in store.modules()] == ids
    store.remove(ids[2])
    again = store.put(blobs[2]).module_id                # removed and stored anew: now the last
    assert [m.module_id for m in store.modules()] == ids[:2] + ids[3:] + [again]


def test_tags_move_list_and_remove(store, wasm):
    a = store.put(variant(wasm, 1), tags=["v1", "latest"]).module_id
    b = store.put(variant(wasm, 2)).module_id
    [moved] = store.tag(b, ["latest"], user="carol")
    assert moved.module_id == b and moved.updated_by == "carol"
    assert [(t.tag, t.module_id) for t in store.tags()] == [("latest", b), ("v1", a)]
    assert store.lookup("latest").module_id == b and store.lookup(a).tags == ("v1",)
    assert store.lookup("nope") is None
    store.remove("v1")
    assert store.lookup(a).tags == ()
    gone = store.remove(b)                          # a module id removes the module and its tags
    assert gone.module_id == b and not store.wasm_path(b).exists()
    assert not list(store.modules_dir.glob(f"{b}-*.cwasm"))
    assert [t.tag for t in store.tags()] == [] and [m.module_id for m in store.modules()] == [a]
    assert store.verify() == ([], [])


@pytest.mark.parametrize("bad, why", [
    ("", "must start with a letter"), ("1abc", "must start with a letter"), ("a b", "only letters"),
    ("a/b", "only letters"), ("x" * 51, "longer than 50"), ("ab" * 32, "module id"), (7, "must be a string"),
    ("é", "must start with a letter"),
])
def test_tag_names_are_validated(bad, why):
    with pytest.raises(StoreError, match=why):
        validate_tag(bad)


def test_valid_tag_names():
    for ok in ["a", "regex-v0.1", "A_b.c-D", "x" * 50, "deadbeef"]:
        assert validate_tag(ok) == ok


def test_bad_requests_store_nothing(store, wasm):
    with pytest.raises(LoadError, match="not a controller"):
        store.put(b"\0asm\x01\0\0\0")
    with pytest.raises(LoadError, match="not a core Wasm module"):
        store.put(b"garbage")
    with pytest.raises(StoreError, match="empty upload"):
        store.put(b"")
    with pytest.raises(StoreError, match="must start with a letter"):
        store.put(wasm, tags=["9lives"])
    with pytest.raises(TooLarge, match="over the upload limit of 100"):
        Store(store.root, max_upload_bytes=100).put(wasm)
    assert store.modules() == [] and not list(store.modules_dir.iterdir())
    with pytest.raises(NotFound, match="unknown module id"):
        store.tag("0" * 64, ["t"])
    with pytest.raises(StoreError, match="64 lowercase hex"):
        store.tag("abc", ["t"])
    with pytest.raises(NotFound, match="unknown tag 'nope'"):
        store.remove("nope")
    with pytest.raises(NotFound, match="unknown module id"):
        store.remove("0" * 64)


def test_resolve_controller(store, wasm, scripted_wasm, tmp_path):
    mid = store.put(wasm, tags=["mine"]).module_id
    assert resolve_controller(mid, store) == store.wasm_path(mid)
    assert resolve_controller("mine", store) == store.wasm_path(mid)
    assert resolve_controller(str(scripted_wasm), store) == scripted_wasm
    assert resolve_controller("yesno", store).suffix == ".wasm"          # a shipped controller, built
    with pytest.raises(NotFound, match="unknown module id"):
        resolve_controller("e" * 64, store)
    with pytest.raises(NotFound, match="is not a file, a tag, a module id or a shipped controller"):
        resolve_controller("nothing-here", store)
    with pytest.raises(NotFound, match="no such file"):
        resolve_controller(str(tmp_path / "missing.wasm"), store)
    # A server never reads files its clients name.
    with pytest.raises(NotFound, match="is not a tag, a module id or a shipped controller"):
        resolve_controller(str(scripted_wasm), store, allow_paths=False)


def _uploader(root: Path, wasm_path: Path, first: int, count: int, prefix: str | None = None) -> subprocess.Popen:
    args = [sys.executable, str(HERE / "_store_uploader.py"), str(root), str(wasm_path), str(first), str(count)]
    if prefix:
        args.append(prefix)
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_kill_9_mid_upload_leaves_store_consistent(tmp_path, scripted_wasm):
    root = tmp_path / "store"
    committed: list[str] = []
    for rnd in range(5):
        proc = _uploader(root, scripted_wasm, rnd * 1000, 1000, prefix=f"r{rnd}-")
        # Kill at a moment that varies between rounds: after a few uploads went through.
        deadline = time.monotonic() + 60
        seen = []
        while len(seen) < 2 + rnd and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line.strip())
        time.sleep(0.013 * (rnd + 1))
        os.kill(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
        assert len(seen) >= 2 + rnd, err
        committed += seen + out.split()
    store = Store(root)
    problems, _ = store.verify()
    assert problems == []
    ids = {m.module_id for m in store.modules()}
    assert set(committed) <= ids                     # no earlier module lost
    for m in store.modules():                       # whatever is there is whole
        assert hashlib.sha256(store.wasm_path(m.module_id).read_bytes()).hexdigest() == m.module_id
    # The store keeps working after the crashes.
    assert store.put(variant(scripted_wasm.read_bytes(), 99999), tags=["after"]).module_id in {
        t.module_id for t in store.tags() if t.tag == "after"}


def test_processes_uploading_at_once(tmp_path, scripted_wasm):
    root = tmp_path / "store"
    # Two writers on overlapping modules (same bytes for k in 5..9) and one tag both move.
    procs = [_uploader(root, scripted_wasm, 0, 10, "a-"), _uploader(root, scripted_wasm, 5, 10, "b-")]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        outs.append(out.split())
    store = Store(root)
    assert store.verify() == ([], [])
    assert {m.module_id for m in store.modules()} == set(outs[0]) | set(outs[1])
    assert len(store.modules()) == 15
    tags = {t.tag: t.module_id for t in store.tags()}
    assert len(tags) == 22
    assert tags["a-latest"] == outs[0][-1] and tags["b-latest"] == outs[1][-1]
    for k in range(5, 10):
        assert tags[f"a-{k}"] == tags[f"b-{k}"]


def test_reading_never_creates_the_store(tmp_path):
    store = Store(tmp_path / "nothing-yet")
    assert store.tags() == [] and store.modules() == [] and store.lookup("x") is None
    with pytest.raises(NotFound):
        resolve_controller("no-such-thing", store)
    assert not (tmp_path / "nothing-yet").exists()
