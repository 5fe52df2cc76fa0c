"""Shared fixtures: compiled test controllers, runtimes over a byte-level tokenizer."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import aicirt
from aicirt.build import toolchain

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _require as require  # noqa: E402  (lives in tests/, which the line above puts on the path)


def pytest_runtest_setup(item: pytest.Item) -> None:
    require.check_tools(item)


@pytest.fixture(scope="session")
def scripted_wasm() -> Path:
    """tests/controllers/scripted.c: writes its own ABI glue, so it builds without the SDK."""
    return toolchain.build_cached(HERE / "controllers" / "scripted.c", sdk=False)


@pytest.fixture
def runtime():
    """A runtime for engine tests. A generous soft deadline: on a loaded CI machine a call could
    otherwise come back "pending" and shift the step at which things happen (late results have
    their own tests)."""
    rt = aicirt.Runtime(aicirt.ByteTokenizer(), limits=aicirt.Limits(soft_deadline_s=5.0), cache_dir=False)
    yield rt
    rt.close()


@pytest.fixture
def ctrl(runtime, scripted_wasm):
    """tests/controllers/scripted.c loaded into `runtime`."""
    return runtime.load(scripted_wasm)


# Test runtimes wait longer than the default soft deadline (25 ms), so that a call that is merely
# slow on a busy machine is not "pending"; tests of lateness set soft_deadline_s themselves.
TEST_SOFT_DEADLINE_S = 0.5

# How tests state timing (they must pass on a 2-core machine at load 8, `make test-busy`):
# - a wait for a result that must come (a quick call, a stuck call reaching its hard limit) uses
#   RESULT_WAIT_S: BatchHandle.wait returns as soon as the calls are done, so a generous bound
#   costs nothing and only stops a hang; it is not a timing promise;
# - a loop that waits for an event (a call stopped, a worker retired) is bounded by HANG_GUARD_S
#   of wall-clock time, and then asserts the event;
# - a promise about cost ("rejected cheaply", "does not run here") is checked in CPU time
#   (`cpu_seconds`), which other processes on the machine do not inflate;
# - a promise about isolation ("never held up") by the order of events (the healthy sequence
#   finished while the stuck call was still running); latency figures live in bench/.
RESULT_WAIT_S = 30.0
HANG_GUARD_S = 60.0


@pytest.fixture(autouse=True)
def _generous_default_soft_deadline(monkeypatch):
    """A runtime a test builds without limits (`aicirt.Runtime(tok)`) gets TEST_SOFT_DEADLINE_S as
    its soft deadline, not the production 25 ms: at load 8-12 a first call could take longer than
    25 ms and came back "pending" where the test checks its result. Only the default the runtime fills in changes; explicit `Limits(...)` are as given,
    and `aicirt.Limits()` itself still has the production default."""
    import functools
    from aicirt.core import runtime as runtime_module
    monkeypatch.setattr(runtime_module, "Limits",
                        functools.partial(aicirt.Limits, soft_deadline_s=TEST_SOFT_DEADLINE_S))


def guarded_steps(what: str):
    """0, 1, 2, ... for a loop that steps until an event (break when it happens). Raises
    AssertionError naming `what` once HANG_GUARD_S of wall-clock time have passed: a hang guard,
    not a timing promise."""
    import itertools
    import time
    t0 = time.monotonic()
    for k in itertools.count():
        if time.monotonic() - t0 > HANG_GUARD_S:
            raise AssertionError(f"{what}: not after {HANG_GUARD_S:g} s ({k} steps)")
        yield k


def cpu_seconds(*, thread: bool = False) -> float:
    """CPU seconds used so far by this process (all its threads), or with `thread=True` by the
    calling thread only. Differences of two readings measure work, whatever the machine's load."""
    import time
    return time.thread_time() if thread else time.process_time()


@pytest.fixture
def rt():
    runtime = aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False,
                             limits=aicirt.Limits(soft_deadline_s=TEST_SOFT_DEADLINE_S))
    yield runtime
    runtime.close()


@pytest.fixture
def make_rt():
    made = []

    def make(**limits):
        limits.setdefault("soft_deadline_s", TEST_SOFT_DEADLINE_S)
        runtime = aicirt.Runtime(aicirt.ByteTokenizer(), limits=aicirt.Limits(**limits), cache_dir=False)
        made.append(runtime)
        return runtime
    yield make
    for r in made:
        r.close()


def mask_tokens(outcome, row: int) -> list[int]:
    """The token ids a mask row allows."""
    import numpy as np
    bits = np.unpackbits(outcome.masks[row].view(np.uint8), bitorder="little")
    return [int(t) for t in np.nonzero(bits)[0]]


# The vLLM tests run in `make test-vllm`, in a .venv that has vLLM's CPU build (and torch), and
# the real-model end-to-end tests in `make test-slow` (the model extra, llama-cpp-python); the
# README's test command installs none of these, so there they are not collected rather than skipped.
_NEEDS = {"test_vllm_offline.py": "vllm", "test_vllm_processor.py": "vllm", "test_vllm_serve.py": "vllm",
          "test_vllm_mrv2.py": "vllm", "test_vllm_engine.py": "vllm", "test_vllm_engine_serve.py": "vllm",
          "test_vllm_engine_tp.py": "vllm", "test_vllm_engine_dp.py": "vllm",
          "test_vllm_torch_masks.py": "torch", "test_engine_e2e.py": "transformers",
          "test_llamacpp.py": "llama_cpp"}


# Modules other engineers own whose every test is timing-sensitive (the others say so with
# `pytestmark = pytest.mark.timing` in the module): `make test-busy` / CI's loaded stage run them.
_TIMING_MODULES = {"test_runtime_limits.py", "test_cpu_limits.py"}


@pytest.hookimpl(tryfirst=True)   # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in _TIMING_MODULES:
            item.add_marker(pytest.mark.timing)


def pytest_ignore_collect(collection_path, config):
    import importlib.util
    need = _NEEDS.get(collection_path.name)
    return bool(need) and importlib.util.find_spec(need) is None
