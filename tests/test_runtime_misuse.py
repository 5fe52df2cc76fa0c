"""The error contract: misuse of the API raises (ValueError / TypeError, the same on both hot
paths, before anything runs); nothing a controller does raises. Lifetimes leave nothing behind."""
from __future__ import annotations

import random

import pytest
from scripted import bad_host_ptr, bad_tokenize_ptr, branch, log, result, script, splice, stop

import aicirt
from aicirt import SeqState, StepInput

HEALTHY = result(branch(mask=[65]))


@pytest.fixture
def ctrl(rt, scripted_wasm):
    return rt.load(scripted_wasm)


def spawn(rt, ctrl, *steps):
    return rt.new_request(ctrl, arg=script(*(steps or (HEALTHY,)))).spawn()


def test_the_same_sequence_twice_in_one_submit_raises_before_anything_runs(rt, ctrl):
    seq = spawn(rt, ctrl)
    with pytest.raises(ValueError, match="submitted twice"):
        rt.submit([StepInput(seq, [1]), StepInput(seq, [1])])
    assert seq.state is SeqState.IDLE and seq.calls == 0
    assert rt.submit([StepInput(seq, [1])]).wait().results[0].status == "ok"


def test_a_closed_sequence_in_submit_raises(rt, ctrl):
    seq, other = spawn(rt, ctrl), spawn(rt, ctrl)
    seq.close()
    with pytest.raises(ValueError, match=f"sequence {seq.id} is closed"):
        rt.submit([StepInput(other, [1]), StepInput(seq, [1])])
    assert other.calls == 0


def test_a_sequence_of_another_runtime_raises(rt, ctrl, scripted_wasm):
    with aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False) as rt2:
        foreign = spawn(rt2, rt2.load(scripted_wasm))
        with pytest.raises(ValueError, match="not a sequence of this runtime"):
            rt.submit([StepInput(foreign, [1])])


def test_submit_takes_step_inputs_only(rt, ctrl):
    seq = spawn(rt, ctrl)
    with pytest.raises(TypeError, match="StepInput"):
        rt.submit([(seq, [1], None)])


def test_a_batch_is_waited_once_and_forks_once(rt, ctrl):
    seq = spawn(rt, ctrl, result(branch(mask=[65]), branch(mask=[66])), HEALTHY)
    handle = rt.submit([StepInput(seq, [1])])
    out = handle.wait()
    assert len(out.results[0].forks) == 1
    with pytest.raises(ValueError, match="already waited"):
        handle.wait()
    assert len(seq.request.sequences) == 2 and seq.request.forks == 1


def test_submitting_a_sequence_whose_batch_was_not_waited_raises(rt, ctrl):
    seq = spawn(rt, ctrl)
    handle = rt.submit([StepInput(seq, [1])])
    with pytest.raises(ValueError, match="not been waited for"):
        rt.submit([StepInput(seq, [1])])
    assert handle.wait().results[0].status == "ok"


@pytest.mark.parametrize("use", ["spawn", "load", "new_request", "submit"])
def test_use_after_runtime_close_raises_value_error(scripted_wasm, use):
    rt = aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False)
    ctrl = rt.load(scripted_wasm)
    req = rt.new_request(ctrl, arg=script(HEALTHY))
    seq = req.spawn()
    rt.close()
    rt.close()   # idempotent
    calls = {"spawn": req.spawn, "load": lambda: rt.load(scripted_wasm),
             "new_request": lambda: rt.new_request(ctrl), "submit": lambda: rt.submit([StepInput(seq, [1])])}
    with pytest.raises(ValueError, match="closed"):
        calls[use]()
    assert seq.state is SeqState.CLOSED


def test_close_is_idempotent_and_objects_are_context_managers(rt, ctrl):
    with rt.new_request(ctrl, arg=script(HEALTHY)) as req:
        with req.spawn() as seq:
            assert rt.submit([StepInput(seq, [1])]).wait().results[0].status == "ok"
        assert seq.closed and seq.state is SeqState.CLOSED
        seq.close()
    assert req.closed
    with pytest.raises(ValueError, match="closed"):
        req.spawn()


def test_a_host_import_fault_is_recorded_on_its_own_sequence(rt, ctrl):
    """Faults in native (log) and Python (tokenize) imports on worker threads, many rounds beside
    healthy sequences that call host imports too: each message stays with its own sequence."""
    for _ in range(20):
        bad_native = spawn(rt, ctrl, bad_host_ptr(HEALTHY))
        bad_python = spawn(rt, ctrl, bad_tokenize_ptr(HEALTHY))
        good = [spawn(rt, ctrl, log("fine\n", HEALTHY)) for _ in range(4)]
        out = rt.submit([StepInput(s, [1]) for s in (*good[:2], bad_native, bad_python, *good[2:])]).wait()
        r = out.results
        assert r[2].status == "error" and "host import `log`: range" in r[2].error
        assert r[3].status == "error" and "host import `tokenize`: range" in r[3].error
        for healthy in r[:2] + r[4:]:
            assert healthy.status == "ok" and healthy.error is None and healthy.logs == "fine\n"
        for s in (bad_native, bad_python, *good):
            s.close()


def test_random_lifetimes_leave_no_instance_store_or_pinned_buffer(scripted_wasm):
    """4,000 sequences opened, stepped, forked and closed in random order (closing some while
    their call runs): afterwards no live instance, store, call or pinned mask buffer remains."""
    rng = random.Random(7)
    steps_pool = [HEALTHY, result(branch(mask=[65]), branch(mask=[66])), stop(),
                  result(branch(splices=[splice(ff=[70])]))]
    n_total = 4_000
    with aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False, max_sequences=256,
                        limits=aicirt.Limits(max_forks=2, soft_deadline_s=0.5)) as rt:
        ctrl = rt.load(scripted_wasm)
        live: list = []
        made = 0
        while made < n_total or live:
            while made < n_total and len(live) < 64:
                steps = [rng.choice(steps_pool) for _ in range(3)]
                live.append(rt.new_request(ctrl, arg=script(*steps)).spawn())
                made += 1
            rng.shuffle(live)
            batch = [s for s in live[:32] if not s.finished]
            handle = rt.submit([StepInput(s, [1] * (s.calls + 1)) for s in batch])
            closed_mid_call = batch[::7]
            for s in closed_mid_call:
                s.close()                     # while its call is out: freed when the call ends
            for s, r in zip(batch, handle.wait().results):
                assert (r.status == "error" and r.error == "sequence was closed") == (s in closed_mid_call)
                live.extend(r.forks)
            for s in list(live):
                if s.closed or s.finished or rng.random() < 0.2:
                    s.close()
                    live.remove(s)
        assert made == n_total
        assert rt.live_sequences == 0
        assert not rt.registry.calls_out and not rt.registry.closing_count
        assert rt.registry.pinned_buffers() == set()


def _vm_mib() -> int:
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return int(status["VmSize"].split()[0]) // 1024


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_closing_a_runtime_frees_its_address_space_reservation(scripted_wasm):
    """Each Runtime reserves its pool's address space (max_sequences x memory limit); close()
    must give it back even while the caller still holds a Controller it loaded."""
    import gc
    for _ in range(2):
        gc.collect()
        before = _vm_mib()
        rt = aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False, prebuild_trie=False)
        ctrl = rt.load(scripted_wasm)
        seqs = [rt.new_request(ctrl, arg=script(HEALTHY)).spawn() for _ in range(4)]
        rt.submit([StepInput(s, [1]) for s in seqs]).wait()
        during = _vm_mib()
        assert during > before + 10_000     # 1024 slots x 64 MiB reserved
        rt.close()
        del rt, seqs
        gc.collect()
        assert _vm_mib() < during - 10_000, "the runtime's reservation outlived close()"
        assert ctrl.module is None             # what it kept alive is released
