"""The memory budget of all live sequences (aicirt.core.memory.MemoryBudget, Limits.memory_budget_bytes):
every sequence reserves its memory limit and log; a new request's sequence past the budget is
refused with a clear error, never one that runs; forks are counted; a server keeps requests
waiting for room, or answers 503 with Retry-After, and every request it runs ends well."""
from __future__ import annotations

import threading

import pytest
from hostile.wat import module

import aicirt
from aicirt import StepInput
from aicirt.core.memory import MemoryBudget, OverBudget, default_budget_bytes, machine_memory_bytes

MIB = 1 << 20


def toucher(mib: int) -> bytes:
    """A controller that grows its memory to `mib` MiB and writes every 4 KiB page of it, on
    every call (a legal controller that uses all the memory it is allowed)."""
    body = (f"(if (i32.lt_u (memory.size) (i32.const {mib * 16}))"
            f" (then (drop (memory.grow (i32.sub (i32.const {mib * 16}) (memory.size))))))"
            " (block $d (loop $l (br_if $d (i32.ge_u (global.get $heap) (i32.const " + str(mib << 20) + ")))"
            " (i32.store8 (global.get $heap) (i32.const 1))"
            " (global.set $heap (i32.add (global.get $heap) (i32.const 4096))) (br $l)))"
            " (global.set $heap (i32.const 65536))")
    return module(body)


def limits(n_sequences: int, mib: int = 8, **kw) -> aicirt.Limits:
    per = (mib << 20) + aicirt.Limits().log_bytes
    return aicirt.Limits(memory_bytes=mib << 20, memory_budget_bytes=n_sequences * per, soft_deadline_s=5.0, **kw)


def step_ok(rt, seqs) -> None:
    out = rt.submit([StepInput(s, [1]) for s in seqs]).wait()
    assert [r.status for r in out.results] == ["ok"] * len(seqs), [r.error for r in out.results]


def test_new_sequences_past_the_budget_are_refused_running_ones_untouched():
    with aicirt.Runtime(aicirt.ByteTokenizer(), limits=limits(3), cache_dir=False) as rt:
        budget = rt.memory_budget
        assert budget.per_sequence_bytes == 8 * MIB + rt.limits.log_bytes
        ctrl = rt.load(toucher(8))
        seqs = [rt.new_request(ctrl).spawn() for _ in range(3)]
        step_ok(rt, seqs)                                   # each touched its 8 MiB
        assert budget.sequences == 3 and budget.reserved_bytes == 3 * budget.per_sequence_bytes
        assert not budget.room_for(1)
        req = rt.new_request(ctrl)
        with pytest.raises(OverBudget, match=r"memory budget full: 3 live sequences hold 24 MiB .*Limits.memory_budget_bytes"):
            req.spawn()
        assert isinstance(OverBudget("x"), aicirt.AicirtError)
        assert req.sequences == [] and budget.sequences == 3 and budget.refused == 1
        step_ok(rt, seqs)                                   # the running ones go on as before
        child = seqs[0].fork()                              # a fork is counted, never refused
        assert budget.sequences == 4 and budget.reserved_bytes > budget.limit_bytes
        step_ok(rt, [child])
        child.close()
        seqs[1].close()
        seqs[1].close()                                     # closing twice gives back once
        assert budget.sequences == 2 and budget.room_for(1)
        seqs.append(req.spawn())                            # room again
        step_ok(rt, seqs[2:])
        for s in seqs:
            s.close()
        assert budget.sequences == 0 and budget.reserved_bytes == 0


def test_a_sequence_that_fails_gives_its_share_back():
    # no free pooled slot: the instantiation fails, and its reservation goes back at once
    with aicirt.Runtime(aicirt.ByteTokenizer(), limits=limits(5), cache_dir=False, max_sequences=2) as rt:
        ctrl = rt.load(toucher(8))
        seqs = [rt.new_request(ctrl).spawn() for _ in range(2)]
        with pytest.raises(aicirt.AicirtError) as e:
            rt.new_request(ctrl).spawn()
        assert not isinstance(e.value, OverBudget) and rt.memory_budget.sequences == 2
        for s in seqs:
            s.close()
    # a trapping `_initialize` fails the first call: the share comes back at close
    with aicirt.Runtime(aicirt.ByteTokenizer(), limits=limits(2), cache_dir=False) as rt:
        ctrl = rt.load(module(initialize="unreachable"))
        for _ in range(5):
            s = rt.new_request(ctrl).spawn()
            out = rt.submit([StepInput(s, [1])]).wait()
            assert out.results[0].status == "error"
            s.close()
        assert rt.memory_budget.sequences == 0


def test_default_budget_is_sized_from_the_machine():
    machine = machine_memory_bytes()
    with aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False) as rt:
        per = rt.limits.memory_bytes + rt.limits.log_bytes
        assert rt.memory_budget.limit_bytes == default_budget_bytes(per)
        if machine is not None:
            assert rt.memory_budget.limit_bytes == max(per, int(machine * 0.75))
    with pytest.raises(ValueError, match="memory_budget_bytes"):
        aicirt.Limits(memory_budget_bytes=-1)
    with pytest.raises(ValueError, match="positive"):
        MemoryBudget(0, 1)


def test_budget_counts_from_many_threads():
    budget = MemoryBudget(1000, 10)
    got: list[int] = []

    def take():
        for _ in range(50):
            try:
                got.append(budget.reserve())
            except OverBudget:
                pass
    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 100 and budget.reserved_bytes == 1000 and budget.refused == 300
    for n in got:
        budget.release(n)
    assert budget.reserved_bytes == 0 and budget.sequences == 0


# --- the server: requests wait for room, or get 503 with Retry-After ------------------------------
def test_server_runs_many_touchers_under_a_small_budget(tmp_path):
    """12 requests of 8 MiB touchers under a budget of 3 sequences: at most 3 run at once (the
    others wait in the queue), every one finishes without error."""
    pytest.importorskip("fastapi")
    import httpx
    from _server_helpers import aici_run, live_server

    from aicirt.engine.backends import load_backend
    from aicirt.serve.settings import Settings

    settings = Settings(store=str(tmp_path), max_context=256, max_batch=16, max_queue=32, limits=limits(3))
    with live_server(settings, backend=load_backend("scripted")) as (url, server):
        mid = httpx.post(url + "/v1/controllers", content=bytes(toucher(8))).json()["module_id"]
        results: list = [None] * 12
        peak = [0]
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                peak[0] = max(peak[0], server.runtime.memory_budget.sequences)
                stop.wait(0.001)

        def one(i):
            results[i] = aici_run(url, {"controller": mid, "controller_arg": "", "prompt": "Go: ", "max_tokens": 4})
        watcher = threading.Thread(target=watch)
        watcher.start()
        threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        watcher.join()
        assert all(r is not None and r["errors"] == [] for r in results), results
        assert all(r["usage"]["sampled_tokens"] == 4 for r in results)
        budget = server.runtime.memory_budget
        assert 1 <= peak[0] <= 3 and server.loop.peak_running <= 3 and budget.refused == 0
        assert "aicirt_memory_budget_bytes" in httpx.get(url + "/metrics").text


def test_server_answers_503_with_retry_after_when_memory_and_queue_are_full(tmp_path):
    pytest.importorskip("fastapi")
    import httpx
    from _server_helpers import live_server, wait_until

    from aicirt.engine.backends import ScriptedBackend
    from aicirt.serve.settings import Settings

    settings = Settings(store=str(tmp_path), max_context=4096, max_batch=8, max_queue=1, retry_after_s=3,
                        limits=limits(1))
    backend = ScriptedBackend(forward_delay_s=0.01)     # the first request runs for seconds
    with live_server(settings, backend=backend) as (url, server):
        mid = httpx.post(url + "/v1/controllers", content=bytes(toucher(8))).json()["module_id"]
        body = {"controller": mid, "controller_arg": "", "prompt": "Go: "}
        first = threading.Thread(target=lambda: httpx.post(url + "/v1/run", json={**body, "max_tokens": 300}, timeout=120))
        first.start()
        wait_until(lambda: server.runtime.memory_budget.sequences == 1, 30, "the first request to run")
        second = threading.Thread(target=lambda: httpx.post(url + "/v1/run", json={**body, "max_tokens": 2}, timeout=120))
        second.start()
        wait_until(lambda: server.loop.queue_depth == 1, 30, "the second request to wait")
        r = httpx.post(url + "/v1/run", json={**body, "max_tokens": 2}, timeout=30)
        assert r.status_code == 503 and r.headers["Retry-After"] == "3"
        assert "memory budget is full" in r.text and "Limits.memory_budget_bytes" in r.text
        first.join()
        second.join()
        assert server.runtime.memory_budget.sequences == 0


def test_a_sequence_closed_mid_call_is_freed_by_collect_without_another_batch():
    """Closed while its call runs, a sequence is freed once the call ends: by the next wait(), or
    by Runtime.collect() on an idle host (its memory and its budget share come back)."""
    import time

    from hostile.wat import loop_forever

    with aicirt.Runtime(aicirt.ByteTokenizer(), limits=limits(2, call_timeout_s=0.05, first_call_timeout_s=0.05),
                        cache_dir=False) as rt:
        ctrl = rt.load(module(loop_forever()))
        seq = rt.new_request(ctrl).spawn()
        out = rt.submit([StepInput(seq, [1])]).wait(0.0)
        assert out.results[0].status == "pending"
        seq.close()
        assert rt.memory_budget.sequences == 1 and rt.registry.closing_count == 1
        deadline = time.monotonic() + 30          # the call ends at its CPU limit (or its wall backstop)
        freed = 0
        while not freed and time.monotonic() < deadline:
            freed = rt.collect()
            time.sleep(0.02)
        assert freed == 1 and rt.memory_budget.sequences == 0 and rt.live_sequences == 0
        assert rt.collect() == 0
