"""The per-argument prepare (`aicirt_prepare`, docs/protocol.md#binary) and the prepared-template
cache (aicirt.core.prepared): prepared once per (controller, argument, capabilities) for any number
of requests; other arguments prepare on their own; a trapping, looping, memory-hungry or
rule-breaking prepare ends only its own request, with a clear error, and is remembered; the cache
is bounded by bytes, counted in the memory budget and freed at close; the json controller's masks
are the same with and without it."""
from __future__ import annotations

import gc
import json
import weakref

import pytest
import wasmtime
from conftest import mask_tokens

import aicirt
from aicirt import Capabilities, LoadError, StepInput
from aicirt import program as P
from aicirt.build import toolchain
from aicirt.core import prepared as prep

HOST = "aici:controller/host@0.1.0"
# A controller whose prepare reads the argument's first byte c and allows token c from then on
# (mid-process does the same itself when no prepare ran). Its prepare logs "prepared" (how the
# tests count prepares) and, by c, misbehaves: 'T' traps, 'L' loops, 'M' grows memory until
# refused then traps, 'S' asks its seq-id, 'V' sets a variable, 'P' writes arg[1] pages of 4 KiB.
# Its template part (TEMPLATE_EXPORT, aicirt_prepare_template) logs "template" and sets $warm, after
# which its masks also allow token c + 1 (a real controller's template part must leave its results
# unchanged: here the change shows which state a request started from); 'U' makes it trap.
PREPARER = """
  (import "{host}" "arg" (func $arg (param i32)))
  (import "{host}" "log" (func $log (param i32 i32)))
  (import "{host}" "self-seq-id" (func $seq_id (result i32)))
  (import "{host}" "var-set" (func $var_set (param i32 i32 i32 i32)))
  (memory (export "memory") 2)
  (global $bump (mut i32) (i32.const 8192))
  (global $token (mut i32) (i32.const 0))
  (global $prepared (mut i32) (i32.const 0))
  (global $warm (mut i32) (i32.const 0))
  (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $bump))
    (global.set $bump (i32.add (global.get $bump) (i32.and (i32.add (local.get 3) (i32.const 7)) (i32.const -8))))
    (if (i32.gt_u (global.get $bump) (i32.mul (memory.size) (i32.const 65536)))
      (then (drop (memory.grow (i32.const 16)))))
    (local.get $p))
  (data (i32.const 16) "\\40\\00\\00\\00\\01\\00\\00\\00")
  (data (i32.const 64) "\\01\\00\\00\\00\\80\\00\\00\\00\\09\\00\\00\\00")
  (data (i32.const 256) "prepared\\n")
  (func $prepare
    (local $p i32) (local $c i32) (local $k i32) (local $base i32)
    (call $arg (i32.const 1024))
    (local.set $p (i32.load (i32.const 1024)))
    (if (i32.load (i32.const 1028)) (then (local.set $c (i32.load8_u (local.get $p)))))
    (call $log (i32.const 256) (i32.const 9))
    (if (i32.eq (local.get $c) (i32.const 84)) (then unreachable))
    (if (i32.eq (local.get $c) (i32.const 76)) (then (loop $l (br $l))))
    (if (i32.eq (local.get $c) (i32.const 77)) (then
      (loop $g (br_if $g (i32.ne (memory.grow (i32.const 16)) (i32.const -1))))
      unreachable))
    (if (i32.eq (local.get $c) (i32.const 83)) (then (drop (call $seq_id))))
    (if (i32.eq (local.get $c) (i32.const 86))
      (then (call $var_set (i32.const 256) (i32.const 1) (i32.const 256) (i32.const 1))))
    (if (i32.eq (local.get $c) (i32.const 80)) (then
      (local.set $k (i32.load8_u (i32.add (local.get $p) (i32.const 1))))
      (local.set $base (i32.mul (memory.grow (i32.add (i32.shr_u (local.get $k) (i32.const 4)) (i32.const 1)))
                                (i32.const 65536)))
      (loop $w (if (local.get $k) (then
        (local.set $k (i32.sub (local.get $k) (i32.const 1)))
        (i32.store (i32.add (local.get $base) (i32.mul (local.get $k) (i32.const 4096))) (i32.const 1))
        (br $w))))))
    (global.set $token (local.get $c))
    (global.set $prepared (i32.const 1)))
  {export}
  (func (export "mid-process") (param i32 i32 i32 i32 i32 i32 i32) (result i32)
    (local $t i32) (local $at i32)
    (if (i32.eqz (global.get $prepared)) (then (call $prepare)))
    (memory.fill (i32.const 128) (i32.const 0) (i32.const 36))
    (i32.store (i32.add (i32.const 128) (i32.shl (i32.shr_u (global.get $token) (i32.const 5)) (i32.const 2)))
               (i32.shl (i32.const 1) (i32.and (global.get $token) (i32.const 31))))
    (if (global.get $warm) (then
      (local.set $t (i32.add (global.get $token) (i32.const 1)))
      (local.set $at (i32.add (i32.const 128) (i32.shl (i32.shr_u (local.get $t) (i32.const 5)) (i32.const 2))))
      (i32.store (local.get $at) (i32.or (i32.load (local.get $at))
                                         (i32.shl (i32.const 1) (i32.and (local.get $t) (i32.const 31)))))))
    (i32.const 16))
"""
EXPORT = '(func (export "aicirt_prepare") (call $prepare))'
TEMPLATE_EXPORT = EXPORT + """
  (data (i32.const 272) "template\\n")
  (func (export "aicirt_prepare_template")
    (call $log (i32.const 272) (i32.const 9))
    (if (i32.eq (global.get $token) (i32.const 85)) (then unreachable))
    (global.set $warm (i32.const 1)))"""


DEFAULT_WORTH_FACTOR = prep.WORTH_FACTOR


@pytest.fixture(autouse=True)
def every_template_pays(monkeypatch):
    """The tests below count templates: keep every one, however cheap its prepare (the rule that
    drops a template whose prepare is cheaper than its copy has its own tests)."""
    monkeypatch.setattr(prep, "WORTH_FACTOR", 0.0)


@pytest.fixture
def rt(make_rt):
    """A runtime that makes a template at an argument's first request (Limits.prepared_after=1: what
    most tests here count; the default, 2, has its own test)."""
    return make_rt(prepared_after=1)


@pytest.fixture
def make_rt(make_rt):   # noqa: F811 (conftest's, with prepared_after=1 unless given)
    def make(**limits):
        limits.setdefault("prepared_after", 1)
        return make_rt(**limits)
    return make


def preparer(export: str = EXPORT) -> bytes:
    return wasmtime.wat2wasm(f"(module {PREPARER.format(host=HOST, export=export)})")


def first_calls(rt, seqs) -> list[tuple]:
    """The first calls of `seqs` in one batch, a late one submitted again until it ends (a busy
    machine): [(result, the tokens its mask allows or None)]."""
    got: dict[int, tuple] = {}
    for _ in range(1000):
        todo = [s for s in seqs if s.id not in got]
        if not todo:
            break
        out = rt.submit([StepInput(s, [1, 2], None) for s in todo]).wait()
        for s, r in zip(todo, out.results):
            if r.status != "pending":
                got[s.id] = (r, mask_tokens(out, r.branches[0].mask_row) if r.status == "ok" and r.branches
                             and r.branches[0].mask_row is not None else None)
    return [got[s.id] for s in seqs]


def first(rt, ctrl, arg, capabilities=Capabilities.ALL):
    """The first call of a new request: (result, the tokens its mask allows or None, its log)."""
    req = rt.new_request(ctrl, arg, capabilities)
    seq = req.spawn()
    [(r, allowed)] = first_calls(rt, [seq])
    log = seq.log.decode()
    req.close()
    return r, allowed, log


def test_prepared_once_for_many_requests_with_one_argument(rt):
    ctrl = rt.load(preparer())
    assert ctrl.has_prepare
    got = [first(rt, ctrl, "a") for _ in range(5)]
    assert [allowed for _, allowed, _ in got] == [[97]] * 5
    assert [log.count("prepared") for _, _, log in got] == [1, 0, 0, 0, 0]   # prepare ran once
    assert rt.prepared.stats.prepared == 1 and rt.prepared.stats.forked == 4 and len(rt.prepared) == 1


def test_different_arguments_and_capabilities_prepare_separately(rt):
    ctrl = rt.load(preparer())
    runs = [("a", Capabilities.ALL), ("b", Capabilities.ALL), ("a", Capabilities.ALL), ("b", Capabilities.ALL),
            ("a", Capabilities.FORK), ("a", Capabilities.FORK)]
    got = [first(rt, ctrl, arg, caps) for arg, caps in runs]
    assert [allowed for _, allowed, _ in got] == [[97], [98], [97], [98], [97], [97]]
    assert [log.count("prepared") for _, _, log in got] == [1, 1, 0, 0, 1, 0]
    assert len(rt.prepared) == 3


def test_without_the_export_every_request_prepares_as_before(rt):
    ctrl = rt.load(preparer(export=""))
    assert not ctrl.has_prepare
    got = [first(rt, ctrl, "a") for _ in range(3)]
    assert [(allowed, log.count("prepared")) for _, allowed, log in got] == [([97], 1)] * 3
    assert len(rt.prepared) == 0 and rt.prepared.stats.prepared == 0


def test_with_the_cache_off_every_request_prepares(make_rt):
    rt = make_rt(prepared_cache_bytes=0)
    ctrl = rt.load(preparer())
    got = [first(rt, ctrl, "a") for _ in range(3)]
    assert [(allowed, log.count("prepared")) for _, allowed, log in got] == [([97], 1)] * 3
    assert len(rt.prepared) == 0


def test_a_prepare_export_of_another_type_is_a_load_error(rt):
    with pytest.raises(LoadError, match=r"export `aicirt_prepare` has type \(i32\) -> \(\), expected \(\) -> \(\)"):
        rt.load(preparer(export='(func (export "aicirt_prepare") (param i32))'))


@pytest.mark.parametrize("arg, needle", [
    ("T", "aicirt_prepare: "),
    ("S", "host import `self-seq-id`: `aicirt_prepare` may not call it"),
    ("V", "host import `var-set`: `aicirt_prepare` may not call it"),
])
def test_a_failing_prepare_ends_only_its_request_and_is_remembered(rt, arg, needle, monkeypatch):
    ctrl = rt.load(preparer())
    bad, good = rt.new_request(ctrl, arg), rt.new_request(ctrl, "a")
    seqs = [bad.spawn(), good.spawn()]
    (rb, _), (rg, allowed) = first_calls(rt, seqs)
    assert rb.status == "error" and needle in rb.error and "prepared" in seqs[0].log.decode()
    assert rg.status == "ok" and allowed == [97]
    first_error = rb.error
    # the same argument again: the remembered error at once, prepare not run
    r, _, log = first(rt, ctrl, arg)
    # (its log starts with the failed one's: the controller's reason, errors.failure_message)
    assert r.status == "error" and "remembered" in r.error and log == "prepared\n"
    assert r.error.startswith("aicirt_prepare: ") and first_error[len("aicirt_prepare: "):][:60] in r.error
    assert rt.prepared.stats.failed_fast == 1 and rt.prepared.stats.remembered == 1
    assert first(rt, ctrl, "a")[1] == [97]                  # its neighbours' key is unharmed
    later = prep._now() + prep.PREPARE_FAILURE_TTL_S + 1    # once the time has passed, it runs again
    monkeypatch.setattr(prep, "_now", lambda: later)
    r, _, log = first(rt, ctrl, arg)
    assert r.status == "error" and "remembered" not in r.error and rt.prepared.stats.remembered == 2
    assert rt.prepared.stats.failed_fast == 1                 # it ran


def test_a_looping_prepare_ends_at_the_first_call_limit_and_is_remembered(make_rt):
    rt = make_rt(first_call_timeout_s=0.2)
    ctrl = rt.load(preparer())
    r, _, _ = first(rt, ctrl, "L")
    assert r.status == "error" and r.error.startswith("aicirt_prepare: ") and "time limit" in r.error
    r, _, log = first(rt, ctrl, "L")
    assert r.status == "error" and "remembered" in r.error and "time limit" in r.error
    assert rt.prepared.stats.failed_fast == 1 and rt.prepared.stats.remembered == 1   # not run again
    assert first(rt, ctrl, "a")[1] == [97]


def test_a_memory_hungry_prepare_ends_only_its_request(make_rt):
    rt = make_rt(memory_bytes=4 << 20)
    ctrl = rt.load(preparer())
    bad, good = rt.new_request(ctrl, "M"), rt.new_request(ctrl, "a")
    seqs = [bad.spawn(), good.spawn()]
    (rb, _), (rg, _) = first_calls(rt, seqs)
    assert rb.status == "error" and rb.error.startswith("aicirt_prepare: ")
    assert rg.status == "ok"
    r, _, _ = first(rt, ctrl, "M")
    assert r.status == "error" and "remembered" in r.error
    bad.close()
    good.close()   # its first call's template is kept; the failed one's is gone
    assert len(rt.prepared) == 1 and rt.prepared.held_bytes == rt.memory_budget.held_bytes > 0


def test_two_requests_with_one_new_argument_at_once_both_work(rt):
    ctrl = rt.load(preparer())
    reqs = [rt.new_request(ctrl, "q") for _ in range(2)]
    seqs = [r.spawn() for r in reqs]
    assert [allowed for _, allowed in first_calls(rt, seqs)] == [[113], [113]]
    assert [s.log.decode().count("prepared") for s in seqs] == [1, 1]   # both prepared; one filled the template
    r, allowed, log = first(rt, ctrl, "q")
    assert allowed == [113] and "prepared" not in log and rt.prepared.stats.prepared == 1


def test_a_request_from_a_template_forks_and_continues_like_the_original(rt):
    ctrl = rt.load(preparer())
    first(rt, ctrl, "z")
    req = rt.new_request(ctrl, "z")
    seq = req.spawn()
    child = seq.fork()
    assert [allowed for _, allowed in first_calls(rt, [seq, child])] == [[122], [122]]
    assert "prepared" not in seq.log.decode() + child.log.decode()
    # the rows API takes it as any sequence
    import numpy as np
    index = np.array([seq.index], dtype=np.int64)
    rows = rt.submit_rows(index, np.array([122], dtype=np.int64)).wait()
    while rows.kind[0] == aicirt.RowKind.PENDING:
        rows = rt.submit_rows(index, np.array([-1], dtype=np.int64)).wait()
    assert mask_tokens(rows, 0) == [122]


def test_templates_are_evicted_by_the_byte_bound_and_counted_in_the_budget(make_rt):
    page = 4096
    rt = make_rt(prepared_cache_bytes=40 * page)
    ctrl = rt.load(preparer())
    first(rt, ctrl, "P\x18")                 # 24 pages written by prepare
    first(rt, ctrl, "P\x18")                 # its template made (settled), this one forked from it
    assert len(rt.prepared) == 1 and rt.prepared.stats.forked == 1
    one = rt.prepared.held_bytes
    assert 24 * page <= one <= 40 * page
    assert rt.memory_budget.held_bytes == one
    first(rt, ctrl, "P\x19")
    first(rt, ctrl, "P\x19")                 # a second template: past the bound, the older one goes
    assert len(rt.prepared) == 1 and rt.prepared.stats.evicted == 1
    assert rt.memory_budget.held_bytes == rt.prepared.held_bytes <= 40 * page
    _, allowed, log = first(rt, ctrl, "P\x18")   # evicted: prepared again
    assert allowed == [80] and "prepared" in log
    first(rt, ctrl, "P\xff")                     # 255 pages: over the bound alone, never kept
    first(rt, ctrl, "P\xff")
    assert rt.prepared.held_bytes <= 40 * page and any("does not fit" in w for w in rt.prepared.stats.not_cached)


def test_a_full_budget_keeps_no_template_and_the_request_still_works(make_rt):
    per_sequence = (64 << 20) + (64 << 10)
    rt = make_rt(memory_budget_bytes=per_sequence)     # room for one sequence, none for a template
    ctrl = rt.load(preparer())
    assert [first(rt, ctrl, "a")[1] for _ in range(2)] == [[97], [97]]
    assert len(rt.prepared) == 0 and rt.memory_budget.held_bytes == 0
    assert any("memory budget" in w for w in rt.prepared.stats.not_cached)


def test_close_frees_the_templates_and_lets_the_engine_go():
    rt = aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False)
    ctrl = rt.load(preparer())
    for arg in ("a", "a", "b", "b"):
        first(rt, ctrl, arg)
    pending = rt.new_request(ctrl, "c").spawn()     # a template still waiting for its first call
    assert len(rt.prepared) == 2 and rt.memory_budget.held_bytes > 0
    engine = weakref.ref(rt.engine)
    rt.close()
    assert len(rt.prepared) == 0 and rt.prepared.held_bytes == 0 and rt.memory_budget.held_bytes == 0
    assert pending.closed
    del rt, pending
    gc.collect()
    assert engine() is None


def walk(rt, ctrl, arg: str, steps: int = 12) -> list[list[int]]:
    """The masks of one request along a walk that samples the highest allowed token (the lowest
    when that is EOS)."""
    seq = rt.new_request(ctrl, arg).spawn()
    tokens, masks = [1, 2], []
    sampled = None
    for _ in range(steps):
        out = rt.submit([StepInput(seq, tokens, sampled)]).wait()
        r = out.results[0]
        while r.status == "pending":      # late on a busy machine: its result comes with a later step
            out = rt.submit([StepInput(seq, tokens, sampled)]).wait()
            r = out.results[0]
        if r.status != "ok" or not r.branches:
            masks.append([r.status])
            break
        branch = r.branches[0]
        if branch.mask_row is None:      # a fast-forward: apply it, sample nothing
            sp = branch.splices[0]
            masks.append(["ff", sp.backtrack, *sp.ff_tokens])
            tokens = tokens[:len(tokens) - sp.backtrack] + list(sp.ff_tokens)
            sampled = None
            continue
        allowed = mask_tokens(out, branch.mask_row)
        masks.append(allowed)
        sampled = allowed[-1] if allowed[-1] != rt.eos_token else allowed[0]
        tokens = tokens + [sampled]
    seq.close()
    return masks


@pytest.mark.parametrize("name, arg", [
    ("json", json.dumps({"type": "object", "properties": {"name": {"type": "string", "maxLength": 4},
                                                          "n": {"type": "integer", "minimum": 3}},
                         "required": ["name", "n"]}) + "\0fast_forward=0"),
    ("grammar", 'start: "ab" NUM ("," NUM)*\nNUM: /[0-9]{1,3}/'),
    ("regex", "(19|20)[0-9]{2}-[a-z]{2,5}"),
    ("program", P.seq("A: ", P.gen(regex="[0-9]{2,4}", name="n"), P.select([" ok", " no"], name="a")).dumps()),
])
def test_masks_are_the_same_with_and_without_the_cache(make_rt, name, arg):
    """The same argument three times through a Runtime with templates (prepared, then copies of
    the template), and once through one without: the same mask at every step of the same walk."""
    src = toolchain.build_cached(name)
    cached = make_rt()
    ctrl = cached.load(src)
    assert ctrl.has_prepare
    runs = [walk(cached, ctrl, arg) for _ in range(3)]
    assert cached.prepared.stats.prepared == 1 and cached.prepared.stats.forked == 2
    plain = make_rt(prepared_cache_bytes=0)
    reference = walk(plain, plain.load(src), arg)
    assert len(reference) >= 4 and runs == [reference] * 3


def test_a_bad_grammar_is_the_first_calls_error_and_is_remembered_with_its_reason(rt):
    ctrl = rt.load(toolchain.build_cached("grammar"))
    r, _, log = first(rt, ctrl, "start: undefined_rule")
    assert r.status == "error" and r.error.startswith("aicirt_prepare: ") and "grammar: " in log
    reason = log.strip().splitlines()[-1]
    r, _, again = first(rt, ctrl, "start: undefined_rule")
    assert r.status == "error" and "remembered" in r.error and again.strip().splitlines()[-1] == reason
    assert aicirt.errors.failure_message(r.error, again).startswith(reason + " (aicirt_prepare: ")


def test_json_prepare_log_is_every_requests(rt):
    """What the json controller's prepare reports (a schema it refuses) is in every request's log."""
    ctrl = rt.load(toolchain.build_cached("json"))
    logs = [first(rt, ctrl, '{"type": "object", "maximum": "abc"}')[2] for _ in range(3)]
    assert rt.prepared.stats.forked == 2
    assert all("json: bad schema: value at #/maximum (not a number)" in log for log in logs)


def test_the_engine_and_the_steering_core_start_from_templates():
    """aicirt's engine and the vLLM integration's steering core make their requests through
    Runtime.new_request and Request.spawn: the second request with an argument starts from its
    template there too."""
    from aicirt.engine import Engine, SamplingParams
    from aicirt.engine.backends.scripted import ScriptedBackend
    from aicirt.integrations import steering as st
    tok = aicirt.ByteTokenizer()
    rt = aicirt.Runtime(tok, cache_dir=False, limits=aicirt.Limits(prepared_after=1))
    ctrl = rt.load(toolchain.build_cached("regex"))
    outs = []
    for _ in range(2):
        engine = Engine(ScriptedBackend(tok, script="1999 and 2020"), rt)
        req = engine.generate([1, 2], ctrl, "(19|20)[0-9]{2}", capabilities=st.MASK_ONLY_CAPABILITIES,
                              params=SamplingParams(temperature=0.0, max_tokens=8))
        outs.append((list(req.sequences[0].output_tokens), req.sequences[0].error))
        engine.close()
    assert outs[0] == outs[1] and outs[0][1] is None and len(outs[0][0]) >= 4
    assert rt.prepared.stats.prepared == 1 and rt.prepared.stats.forked == 1
    steered = st.Steering(rt, tok.eos_token_id).open(ctrl, "(19|20)[0-9]{2}", [1, 2], [])
    assert rt.prepared.stats.forked == 2
    steered.close()
    rt.close()


def test_by_default_a_template_is_made_at_an_arguments_second_request(make_rt):
    """Limits.prepared_after (2 by default): an argument's first request prepares without a
    template (it pays no copy), its second makes one, the later ones start from it; an argument
    seen once makes none."""
    rt = make_rt(prepared_after=2)
    ctrl = rt.load(preparer())
    logs = [first(rt, ctrl, b"a")[2] for _ in range(4)] + [first(rt, ctrl, b"b")[2]]
    assert [("prepared" in log) for log in logs] == [True, True, False, False, True]
    st = rt.prepared.stats
    assert (st.unsighted, st.prepared, st.forked, len(rt.prepared)) == (2, 1, 2, 1)
    assert all(first(rt, ctrl, b"a")[1] == [ord("a")] for _ in range(2))


def test_prepared_after_must_be_at_least_one():
    with pytest.raises(ValueError, match="prepared_after"):
        aicirt.Limits(prepared_after=0)


def test_a_template_is_kept_only_if_its_prepare_outweighs_its_copy(monkeypatch):
    assert DEFAULT_WORTH_FACTOR == 2.0
    monkeypatch.setattr(prep, "WORTH_FACTOR", DEFAULT_WORTH_FACTOR)
    assert prep.worth_a_template(500.0, 100.0) and not prep.worth_a_template(150.0, 100.0)


def test_a_prepare_cheaper_than_its_copy_keeps_no_template_and_every_request_prepares(make_rt, monkeypatch):
    """A template whose prepare did not outweigh the copy into it is dropped, and its key prepares
    without one from then on (no copy each time): the same masks, every request prepares."""
    monkeypatch.setattr(prep, "WORTH_FACTOR", 1e9)   # no prepare outweighs its copy
    rt = make_rt()
    ctrl = rt.load(preparer())
    outs = [first(rt, ctrl, b"a") for _ in range(4)]
    assert all(allowed == [ord("a")] and "prepared" in log for _, allowed, log in outs)
    st = rt.prepared.stats
    assert (st.prepared, st.not_worth, st.forked, len(rt.prepared)) == (1, 1, 0, 0)
    assert any("cheaper than" in why for why in st.not_cached)
    assert rt.memory_budget.held_bytes == 0


def test_the_template_part_runs_only_on_the_request_that_makes_the_template(make_rt):
    """aicirt_prepare_template: not on an argument's first request (no template at the default
    prepared_after=2), on the second after aicirt_prepare (its state becomes the template, the
    template part's work included), never on the later ones (they start from that copy)."""
    rt = make_rt(prepared_after=2)
    ctrl = rt.load(preparer(TEMPLATE_EXPORT))
    assert ctrl.has_prepare and ctrl.has_prepare_template
    got = [first(rt, ctrl, "a") for _ in range(4)]
    assert [log for _, _, log in got] == ["prepared\n", "prepared\ntemplate\n", "", ""]
    assert [allowed for _, allowed, _ in got] == [[97], [97, 98], [97, 98], [97, 98]]
    assert rt.prepared.stats.prepared == 1 and rt.prepared.stats.forked == 2
    # with the cache off it never runs
    off = make_rt(prepared_cache_bytes=0)
    ctrl = off.load(preparer(TEMPLATE_EXPORT))
    assert [(allowed, log) for _, allowed, log in (first(off, ctrl, "a") for _ in range(3))] == [([97], "prepared\n")] * 3


def test_a_template_part_alone_is_not_a_prepare(rt):
    """Without aicirt_prepare the template part is never called (nothing to make a template of)."""
    ctrl = rt.load(preparer('(func (export "aicirt_prepare_template") unreachable)'))
    assert not ctrl.has_prepare and not ctrl.has_prepare_template
    assert [(allowed, log) for _, allowed, log in (first(rt, ctrl, "a") for _ in range(2))] == [([97], "prepared\n")] * 2


def test_a_failing_template_part_ends_its_request_and_later_ones_prepare_without_a_template(rt):
    ctrl = rt.load(preparer(TEMPLATE_EXPORT))
    r, _, log = first(rt, ctrl, "U")   # prepared_after=1: the first request makes the template
    assert r.status == "error" and r.error.startswith("aicirt_prepare_template: ") and log == "prepared\ntemplate\n"
    got = [first(rt, ctrl, "U") for _ in range(2)]   # prepared again, no template part, no template
    assert [(r.status, allowed, log) for r, allowed, log in got] == [("ok", [85], "prepared\n")] * 2
    assert len(rt.prepared) == 0 and rt.prepared.stats.remembered == 0
    assert first(rt, ctrl, "a")[1:] == ([97, 98], "prepared\ntemplate\n")   # other arguments unharmed
