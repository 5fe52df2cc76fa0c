"""Many sequences, mixed behaviours, several workers, late calls and closes in flight: every
result is well-formed and the healthy sequences never notice the others."""
from __future__ import annotations

import random
import time

import pytest
from conftest import RESULT_WAIT_S, guarded_steps, mask_tokens
from scripted import branch, log, noop, result, script, splice, trap, var_set

import aicirt
from aicirt import StepInput

BEHAVIOURS = {
    "mask": lambda i: result(branch(mask=[i % 250, 251])),
    "splice": lambda i: result(branch(mask=[7], splices=[splice(when=[7], backtrack=1, ff=[8, 9])])),
    "fork": lambda i: result(branch(mask=[1]), branch(mask=[2])),
    "noop": lambda i: noop(),
    "var": lambda i: var_set(f"v{i}", "x", result(branch(mask=[3]))),
    "log": lambda i: log("hello", result(branch(mask=[4]))),
    "trap": lambda i: trap(),
}


def test_mixed_batch_soak(scripted_wasm):
    rng = random.Random(1234)
    with aicirt.Runtime(aicirt.ByteTokenizer(), workers=3, cache_dir=False,
                        limits=aicirt.Limits(max_forks=1000, soft_deadline_s=0.5)) as rt:
        ctrl = rt.load(scripted_wasm)
        live = {}
        for i in range(96):
            kind = rng.choice(list(BEHAVIOURS))
            steps = [result(branch(mask=[65]))] + [BEHAVIOURS[kind](i)] * 2 + [result(branch(mask=[66]))]
            seq = rt.new_request(ctrl, arg=script(*steps)).spawn()
            live[seq] = (kind, [1, 2, 3])
        for step in range(6):
            items = [StepInput(s, toks) for s, (_, toks) in live.items()]
            out = rt.submit(items).wait()
            for item, r in zip(items, out.results):
                s, toks = item.seq, item.tokens
                kind = live[s][0]
                assert r.status in ("ok", "error"), (kind, r)
                if r.status == "error":
                    assert kind == "trap" and "unreachable" in r.error
                    del live[s]
                    continue
                if not r.branches:
                    del live[s]
                    continue
                for target, b in zip([s, *r.forks], r.branches):
                    if b.mask_row is not None:
                        allowed = mask_tokens(out, b.mask_row)
                        assert allowed, kind
                    new = list(toks) + ([allowed[0]] if b.mask_row is not None else [])
                    live[target] = (kind if target is s else "mask", new)
            # close a few sequences between steps, as an engine cancelling requests would
            for s in rng.sample(list(live), k=min(3, len(live))):
                s.close()
                del live[s]
        assert not any(k == "trap" for k, _ in live.values())


@pytest.mark.timing
def test_close_while_a_call_is_stuck(scripted_wasm):
    from scripted import loop_forever
    rt = aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False,
                        limits=aicirt.Limits(call_timeout_s=0.3, soft_deadline_s=0.01))
    seq = rt.new_request(rt.load(scripted_wasm), arg=script(result(branch(mask=[1])), loop_forever())).spawn()
    assert rt.submit([StepInput(seq, [1], None)]).wait(RESULT_WAIT_S).results[0].status == "ok"   # the quick first call
    assert rt.submit([StepInput(seq, [1, 1], 1)]).wait().results[0].status == "pending"
    seq.close()                      # deferred: the call is still running
    assert seq.finished and seq.state is not aicirt.SeqState.CLOSED
    # waits for the stuck call to hit its limit (0.3 s of CPU: on a busy machine, longer in
    # wall-clock time, so no wall-clock bound here), then frees it
    rt.close()
    assert seq.state is aicirt.SeqState.CLOSED


@pytest.mark.timing
def test_a_sequence_closed_mid_call_stops_pinning_its_mask_buffer(scripted_wasm):
    from scripted import loop_forever
    with aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False,
                        limits=aicirt.Limits(call_timeout_s=0.2, soft_deadline_s=0.01)) as rt:
        ctrl = rt.load(scripted_wasm)
        stuck = rt.new_request(ctrl, arg=script(result(branch(mask=[1])), loop_forever())).spawn()
        other = rt.new_request(ctrl, arg=script(result(branch(mask=[1])))).spawn()
        assert rt.submit([StepInput(stuck, [1], None)]).wait(RESULT_WAIT_S).results[0].status == "ok"   # the quick first call
        assert rt.submit([StepInput(stuck, [1, 1], 1)]).wait().results[0].status == "pending"
        stuck.close()
        for k in guarded_steps("the closed sequence's call hits its limit"):   # 0.2 s of CPU
            if not rt.registry.calls_out:
                break
            rt.submit([StepInput(other, [1] * (k + 2), None)]).wait()
            time.sleep(0.01)
        assert not rt.registry.calls_out and stuck.state is aicirt.SeqState.CLOSED


def test_runtimes_closed_as_soon_as_opened_leave_the_process_sound():
    """A Runtime closed right after it started used to free its worker pool while the epoch
    thread's first check was inside it (and could tick an engine freed after close): heap
    corruption that aborted a later, unrelated `wasm_engine_new` in about 4 runs of 10 at 40
    Runtimes. Run in a child process, so that a corrupted heap fails this test, not the session."""
    import subprocess
    import sys
    code = (
        "import aicirt\n"
        "for _ in range(60):\n"
        "    rt = aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False, prebuild_trie=False)\n"
        "    rt.close()\n"
        "    assert rt.pool.pending == 0 and rt.pool.threads == 0 and rt.pool.stats().threads == 0\n"
        "print('sound')\n")
    out = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "sound", out.stderr[-3000:]
