"""The `program` controller on the scripted engine: every format and step, with exact token traces.

The scripted model writes its script greedily unless the mask forbids it, so a test's script says
what the model "wants" and the trace shows what the program made of it: which tokens were
sampled, which fast-forwarded (one event per engine step), what was captured.
"""
from __future__ import annotations

import json
from functools import cached_property

import pytest

from aicirt import Capabilities, StepInput
from aicirt.engine import Engine, FinishEvent, SamplingParams, TokensEvent
from aicirt.engine.backends.scripted import ScriptedBackend
from aicirt.build.toolchain import build_cached
from aicirt import program as P

EOS = 256


@pytest.fixture(scope="module")
def wasm() -> str:
    return str(build_cached("program"))


class MergeTokenizer:
    """Bytes 0-255 as tokens 0-255, EOS 256, then the given multi-byte tokens; greedy longest-match
    encoding (what token healing and boundary-spanning tokens need)."""

    def __init__(self, merges: list[str]):
        self.merges = [m.encode() for m in merges]
        self.vocab_size = 257 + len(self.merges)
        self.eos_token_id = 256
        self.index = {b: 257 + i for i, b in enumerate(self.merges)}

    @cached_property
    def token_bytes(self) -> list[bytes]:
        return [bytes([i]) for i in range(256)] + [b""] + self.merges

    def encode(self, text: str) -> list[int]:
        data, out, i = text.encode(), [], 0
        while i < len(data):
            for j in range(len(data), i + 1, -1):
                if data[i:j] in self.index:
                    out.append(self.index[data[i:j]])
                    i = j
                    break
            else:
                out.append(data[i])
                i += 1
        return out

    def decode_bytes(self, ids) -> bytes:
        tb = self.token_bytes
        return b"".join(tb[i] for i in ids)


def run(wasm, prog, script, *, prompt="Q: ", tokenizer=None, max_tokens=64, caps=None):
    """(trace, request): trace = [(label, backtrack, text of the tokens appended)] per engine step."""
    tok = tokenizer or ScriptedBackend().tokenizer
    scr = tok.encode(prompt) + (tok.encode(script) if isinstance(script, str) else list(script)) + [EOS] * 4
    backend = ScriptedBackend(tokenizer=tokenizer, script=scr)
    arg = prog.dumps() if isinstance(prog, P.Format) else json.dumps(prog)
    with Engine(backend) as eng:
        req = eng.add_request(tok.encode(prompt), wasm, arg.encode(), params=SamplingParams(max_tokens=max_tokens),
                              capabilities=caps)
        trace = []
        for ev in eng.run():
            if isinstance(ev, TokensEvent):
                trace.append((ev.seq.label, ev.backtrack, tok.decode_bytes(ev.tokens).decode()))
            elif isinstance(ev, FinishEvent):
                assert ev.reason in ("stop", "length", "eos"), (ev.reason, ev.error, "".join(ev.seq.logs))
    return trace, req


def texts(req):
    return [s.text_bytes.decode() for s in req.sequences]


def steps(trace, label=0):
    return [t for (lb, bt, t) in trace if lb == label]


# ---- primitives -------------------------------------------------------------------------------

def test_const_string_is_fast_forwarded_in_one_step(wasm):
    trace, req = run(wasm, P.const("hello"), "hexxo")
    assert trace == [(0, 0, "hello")]                  # one step, no sampling; then the end
    assert texts(req) == ["hello"] and req.sequences[0].finish_reason == "stop"


def test_regex_then_literal_exact_at_the_boundary(wasm):
    prog = P.seq("A: ", P.gen(regex="[0-9]+", name="n"), ". ok")
    trace, req = run(wasm, prog, "A: 42.zz")
    # "A: " forced whole (no longer token starts with its last byte here), digits sampled, "."
    # sampled (it ends the number), " ok" forced to the end in one step
    assert steps(trace) == ["A: ", "4", "2", ".", " ok"]
    assert texts(req) == ["A: 42. ok"] and req.variables == {"n": b"42"}


def first_masks(wasm, prog, tokenizer, steps_in):
    """The allowed tokens at each step of a runtime-level run: steps_in = [(tokens appended, sampled)]."""
    import aicirt
    from conftest import mask_tokens
    rt = aicirt.Runtime(tokenizer, limits=aicirt.Limits(soft_deadline_s=5.0), cache_dir=False)
    try:
        req = rt.new_request(rt.load(wasm), arg=prog.dumps().encode(), capabilities=Capabilities.ALL)
        seq = req.spawn()
        out, full = [], []
        for toks, sampled in steps_in:
            full += toks
            o = rt.submit([StepInput(seq, list(full), sampled)]).wait()
            r = o.results[0]
            out.append(set(mask_tokens(o, r.branches[0].mask_row)) if r.branches and r.branches[0].mask_row is not None
                       else None)
        return out
    finally:
        rt.close()


def test_a_token_spanning_two_elements_is_allowed_iff_its_bytes_fit(wasm):
    tok = MergeTokenizer(["2.", ".x", "42", "x"])
    prog = P.seq(P.gen(regex="[0-9]+", name="n"), ". ok")
    first, after4 = first_masks(wasm, prog, tok, [(list(b"Q: "), None), ([ord("4")], ord("4"))])
    ids = tok.index
    assert {ids[b"2."], ids[b"42"], ord("4")} <= first and ids[b".x"] not in first and ord(".") not in first
    assert {ids[b"2."], ord(".")} <= after4 and ids[b".x"] not in after4
    trace, req = run(wasm, prog, [ord("4"), ids[b"2."], ord(" "), ord("o"), ord("k")], tokenizer=tok)
    assert steps(trace)[:2] == ["4", "2."]              # "2." ends the number and starts the literal
    assert texts(req) == ["42. ok"] and req.variables == {"n": b"42"}


def test_forced_text_is_healed_with_the_token_before_it(wasm):
    tok = MergeTokenizer(['{"', '":', '"a', 'ab'])
    schema = {"type": "object", "properties": {"ab": {"type": "integer"}}, "required": ["ab"],
              "additionalProperties": False}
    trace, req = run(wasm, P.json(schema), '{"ab":12}', tokenizer=tok)
    assert texts(req) == ['{"ab":12}']
    assert json.loads(req.sequences[0].text_bytes) == {"ab": 12}
    # the key is forced: fast-forwarded in the tokens the tokenizer would choose, to its last
    # (no longer token starts with '":' here, so it cannot merge with what follows)
    assert steps(trace)[0] == '{"ab":'
    assert req.sequences[0].output_tokens[:3] == [tok.index[b'{"'], tok.index[b"ab"], tok.index[b'":']]


def test_json_schema_document(wasm):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["name", "n"], "additionalProperties": False}
    trace, req = run(wasm, P.json(schema, name="doc"), '{"name":"Ada","n":42}')
    assert texts(req) == ['{"name":"Ada","n":42}'] and req.variables == {"doc": b'{"name":"Ada","n":42}'}
    assert steps(trace)[0] == '{"name":"'                 # fixed keys fast-forwarded


def test_any_text_max_tokens_and_temperature(wasm):
    trace, req = run(wasm, P.text(max_tokens=3, temperature=0.0), "abcdef")
    assert steps(trace) == ["a", "b", "c"] and texts(req) == ["abc"]


def test_tag_any_text_ends_at_the_first_end_string(wasm):
    trace, req = run(wasm, P.think(), "<think>hmm</thi</think>after")
    assert texts(req) == ["<think>hmm</thi</think>"]
    assert steps(trace)[0] == "<think>"                # the begin forced


def test_think_max_tokens_forces_the_end(wasm):
    prog = P.seq(P.think(max_tokens=2), "\nA: ", P.select(["yes", "no"], name="a"))
    trace, req = run(wasm, prog, "<think>abcdef</think>\nA: no")
    assert texts(req) == ["<think>ab</think>\nA: no"] and req.variables == {"a": b"no"}


def test_stop_strings_end_free_text_and_are_not_captured(wasm):
    prog = P.seq(P.gen(stop=["\n", "."], name="line"), "END")
    trace, req = run(wasm, prog, "hi there.more")
    assert texts(req) == ["hi there.END"] and req.variables == {"line": b"hi there"}


# ---- composition ------------------------------------------------------------------------------

def test_select_optional_star_plus_repeat(wasm):
    _, req = run(wasm, P.select(["yes", "no", "maybe"], name="a"), "maybe")
    assert texts(req) == ["maybe"] and req.variables == {"a": b"maybe"}
    _, req = run(wasm, P.seq(P.optional("Re: "), P.regex("[a-z]+")), "Re: hi")
    assert texts(req) == ["Re: hi"]
    _, req = run(wasm, P.seq(P.optional("Re: "), P.regex("[a-z]+")), "hi")
    assert texts(req) == ["hi"]
    _, req = run(wasm, P.seq(P.star(P.gen(regex="[0-9]", name="d", capture="append")), ";"), "123;")
    assert texts(req) == ["123;"] and req.variables == {"d": b"123"}
    _, req = run(wasm, P.seq(P.plus("ab"), "!"), "!")         # plus: at least one "ab"
    assert texts(req) == ["ab!"]
    _, req = run(wasm, P.seq(P.repeat(P.regex("[a-z]"), 2, 3), "."), "abcd.")
    assert texts(req) == ["abc."]                            # at most 3: the 4th letter is refused
    _, req = run(wasm, P.seq(P.repeat(P.regex("[a-z]"), 2, 3), "."), "a.")
    import re
    assert re.fullmatch(r"a[a-z]{1,2}\.", texts(req)[0])     # at least 2: the "." is refused after one


def test_tag_inside_triggered_tags_inside_a_sequence(wasm):
    weather = P.tag("<f=weather>", P.json({"type": "object", "properties": {"city": {"type": "string"}},
                                           "required": ["city"], "additionalProperties": False}), "</f>")
    time = P.tag("<f=time>", P.regex("[0-9]{2}:[0-9]{2}"), "</f>")
    prog = P.seq(P.think(), P.triggered_tags(["<f="], [weather, time], stop_after_first=True), "<eom>")
    want = '<think>ok</think>Let me check. <f=weather>{"city":"Paris"}</f><eom>'
    trace, req = run(wasm, prog, want, max_tokens=100)   # 67 tokens: max_tokens bounds forced text too
    assert texts(req) == [want]
    # the model wanting an unknown tag after the trigger gets a known one
    _, req = run(wasm, prog, "<think>ok</think><f=stock>")
    assert texts(req)[0].startswith("<think>ok</think><f=") and "stock" not in texts(req)[0]


def test_triggered_tags_at_least_one_allows_no_leading_text(wasm):
    t = P.tag("<a>", P.regex("[0-9]+"), "</a>")
    _, req = run(wasm, P.triggered_tags(["<a>"], [t], at_least_one=True, stop_after_first=True), "hello<a>1</a>")
    assert texts(req)[0].startswith("<a>")


def test_tags_with_separator(wasm):
    t = P.tag("<i>", P.regex("[a-z]+"), "</i>")
    _, req = run(wasm, P.seq(P.tags_with_separator([t], ","), "."), "<i>a</i>,<i>bc</i>.")
    assert texts(req) == ["<i>a</i>,<i>bc</i>."]
    _, req = run(wasm, P.seq(P.tags_with_separator([t], ",", at_least_one=True), "."), ".")
    assert texts(req)[0].startswith("<i>")


def test_token_level_formats(wasm):
    tok = MergeTokenizer(["<|call|>"])
    call = tok.index[b"<|call|>"]
    prog = P.seq(P.token(call), P.regex("[a-z]+"), P.exclude_token([ord("!")]))
    trace, req = run(wasm, prog, [call] + list(b"ab") + [ord("!"), ord("?")], tokenizer=tok)
    out = req.sequences[0].output_tokens
    assert out[0] == call and bytes(out[1:3]) == b"ab" and out[3] not in (ord("!"),)


# ---- steps only this runtime hosts ------------------------------------------------------------

def test_fork_whose_branches_each_fill_a_schema_and_a_parent_that_waits_for_both(wasm):
    city = {"type": "object", "properties": {"c": {"type": "string", "maxLength": 6}}, "required": ["c"],
            "additionalProperties": False}
    num = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
           "additionalProperties": False}
    prog = P.seq("Go:", P.fork(P.seq(P.wait("a", "b"), " both done"), P.json(city, name="a"), P.json(num, name="b")))
    trace, req = run(wasm, prog, 'Go:{"c":"Oslo"}')
    t = texts(req)
    assert t[0] == "Go: both done"
    assert json.loads(t[1][3:]) == json.loads(req.variables["a"]) and set(json.loads(t[1][3:])) == {"c"}
    assert json.loads(t[2][3:]) == json.loads(req.variables["b"]) and set(json.loads(t[2][3:])) == {"n"}
    # the parent wrote its text only after both branches had set their variables
    last_child = max(i for i, (lb, _, _) in enumerate(trace) if lb != 0)
    assert all(i > last_child for i, (lb, _, x) in enumerate(trace) if lb == 0 and "done" in x)


def test_fork_n_copies(wasm):
    _, req = run(wasm, P.fork(*[P.gen(regex="[a-c]{3}")] * 3), "abc")
    assert [len(x) for x in texts(req)] == [3, 3, 3]


def test_fork_without_the_capability_is_refused_naming_the_step(wasm):
    prog = P.seq("x", P.fork("a", "b"))
    tok = ScriptedBackend().tokenizer
    with Engine(ScriptedBackend(script="x")) as eng:
        req = eng.add_request(tok.encode("Q"), wasm, prog.dumps().encode(),
                              capabilities=Capabilities.FF_TOKENS | Capabilities.CONDITIONAL_FF_TOKENS)
        list(eng.run())
    logs = "".join(req.sequences[0].logs)
    assert "program: at /elements/1: fork needs capability `fork`, which this host did not grant" in logs
    assert P.capability_refusal(prog.to_json(), Capabilities.FF_TOKENS) == \
        "at /elements/1: fork needs capability `fork`, which this host did not grant"
    assert P.capability_refusal(prog.to_json(), Capabilities.ALL) is None


def test_per_element_temperature_reaches_the_branch(wasm, runtime):
    prog = P.seq(P.gen(regex="[a-z]", temperature=0.7), P.gen(regex="[0-9]"))
    req = runtime.new_request(runtime.load(wasm), arg=prog.dumps().encode(), capabilities=Capabilities.ALL)
    seq = req.spawn()
    r = runtime.submit([StepInput(seq, list(b"Q: "), None)]).wait().results[0]
    assert r.branches[0].temperature == pytest.approx(0.7)
    r = runtime.submit([StepInput(seq, list(b"Q: a"), ord("a"))]).wait().results[0]
    assert r.branches[0].temperature is None             # the digit has no temperature of its own


def test_structural_tag_wrapper_is_accepted(wasm):
    _, req = run(wasm, P.structural_tag(P.select(["yes", "no"])), "no")
    assert texts(req) == ["no"]


def test_the_end_allows_eos_and_stops(wasm):
    _, req = run(wasm, P.seq("a", P.optional("b")), "a" + chr(0))
    assert texts(req) == ["a"] or texts(req) == ["ab"]
    assert req.sequences[0].finish_reason in ("stop", "eos")


def test_the_last_forced_token_stays_open_when_a_longer_token_could_take_its_place(wasm):
    tok = MergeTokenizer(['{"', '":"', 'ab', '":"x'])
    schema = {"type": "object", "properties": {"ab": {"type": "string"}}, "required": ["ab"],
              "additionalProperties": False}
    trace, req = run(wasm, P.json(schema), [tok.index[b'{"'], tok.index[b"ab"], tok.index[b'":"x']] + list(b'"}'),
                     tokenizer=tok)
    assert steps(trace)[0] == '{"ab'                      # '":"' left open: '":"x' may follow
    assert steps(trace)[1] == '":"x'
    assert texts(req) == ['{"ab":"x"}']


def test_a_token_before_forced_text_carries_it_as_a_conditional_splice(wasm, runtime):
    """Sampling '"' that ends a value appends the next key in the same step (no fast-forward step)."""
    schema = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
              "required": ["a", "b"], "additionalProperties": False}
    req = runtime.new_request(runtime.load(wasm), arg=P.json(schema).dumps().encode(), capabilities=Capabilities.ALL)
    seq = req.spawn()
    r = runtime.submit([StepInput(seq, list(b"Q: "), None)]).wait().results[0]
    assert r.branches[0].mask_row is None                 # '{"a":"' fast-forwarded
    toks = list(b'Q: {"a":"')
    r = runtime.submit([StepInput(seq, toks, None)]).wait().results[0]
    quote = [s for s in r.branches[0].splices if list(s.when_sampled) == [ord('"')]]
    assert quote and bytes(quote[0].ff_tokens) == b',"b":"' and quote[0].backtrack == 0
    n_steps = {}
    for caps in (Capabilities.ALL, Capabilities.ALL & ~Capabilities.CONDITIONAL_FF_TOKENS):
        with Engine(ScriptedBackend(script=list(b'Q: {"a":"x","b":"y"}') + [EOS] * 4)) as eng:
            done = eng.generate(list(b"Q: "), wasm, P.json(schema).dumps().encode(), capabilities=caps)
            n_steps[caps] = eng.stats.steps
        assert texts(done) == ['{"a":"x","b":"y"}']
    # both closing quotes carry what follows them (',"b":"' and '}'): two steps fewer
    assert n_steps[Capabilities.ALL] == n_steps[Capabilities.ALL & ~Capabilities.CONDITIONAL_FF_TOKENS] - 2


def test_captures_that_end_with_the_program_are_written_before_eos_ends_the_sequence(wasm):
    """An engine ends a sequence on EOS without calling its controller again: a splice takes the
    EOS back so that the capture is written (then the program stops); the waiting parent goes on."""
    p = P.seq("Facts:\n", P.fork(P.seq(P.wait("a", "b"), "Done."), P.seq("A: ", P.gen(regex="[A-Z][a-z]{2,12}", name="a")),
                                 P.seq("B: ", P.gen(regex="[0-9]{1,4}", name="b"))))
    with Engine(ScriptedBackend(seed=3)) as eng:
        req = eng.generate(list(b"Q: "), wasm, p.dumps().encode())
    t = texts(req)
    assert t[0] == "Facts:\nDone." and [s.finish_reason for s in req.sequences] == ["stop"] * 3
    assert t[1] == "Facts:\nA: " + req.variables["a"].decode() and t[2] == "Facts:\nB: " + req.variables["b"].decode()


def test_the_token_budget_counts_whole_tokens(wasm):
    """any_text's max_tokens: the last token within the budget is read to its end (it was cut at its
    first byte, killing the sequence, when tokens had several bytes)."""
    tok = MergeTokenizer(["ab", " cd", " ef"])
    prog = P.seq(P.think(max_tokens=2), "X")
    _, req = run(wasm, prog, "<think>ab cd ef</think>X", tokenizer=tok)
    assert texts(req) == ["<think>ab cd</think>X"] and req.sequences[0].finish_reason == "stop"


# ---- label + backtrack -----------------------------------------------------------------------

def test_backtrack_removes_the_thought_and_forces_the_captured_value(wasm):
    think = P.label("T", P.tag("<think>", P.gen(name="thought"), "</think>"))
    prog = P.seq(think, P.backtrack("T", "A: ", P.var("thought")), " ok")
    trace, req = run(wasm, prog, "<think>abc</think>zzzz")
    # the thought is generated, then one splice takes all 18 of its tokens back and forces the
    # captured value; the program goes on after the backtrack (" ok" forced to the end)
    assert trace == [(0, 0, "<think>"), (0, 0, "a"), (0, 0, "b"), (0, 0, "c"),
                     *[(0, 0, ch) for ch in "</think>"], (0, 18, "A: abc"), (0, 0, " ok")]
    assert texts(req) == ["A: abc ok"] and req.variables == {"thought": b"abc"}


def test_a_label_inside_a_token_keeps_the_token_s_head(wasm):
    tok = MergeTokenizer(["x<"])
    prog = P.seq(P.gen(regex="x+"), P.label("L", P.seq("<", P.gen(regex="[0-9]"))), P.backtrack("L", "="), P.gen(regex="[a-z]"))
    trace, req = run(wasm, prog, "xx<5q", tokenizer=tok)
    # "x<" spans the label's start: it is taken back too, and its "x" forced again before "="
    assert trace == [(0, 0, "x"), (0, 0, "x<"), (0, 0, "5"), (0, 2, "x="), (0, 0, "q")]
    assert texts(req) == ["xx=q"]


def test_backtrack_without_text_only_removes(wasm):
    prog = P.seq("a", P.label("L", "b"), P.backtrack("L"), P.gen(regex="[0-9]"))
    trace, req = run(wasm, prog, "a77")            # the scripted model writes by position
    assert trace == [(0, 0, "ab"), (0, 1, ""), (0, 0, "7")] and texts(req) == ["a7"]


def test_backtrack_with_nothing_to_remove_goes_on_at_once(wasm):
    prog = P.seq("a", P.label("L", P.seq()), P.backtrack("L"), P.gen(regex="[0-9]"))
    trace, req = run(wasm, prog, "a7")
    assert trace == [(0, 0, "a"), (0, 0, "7")] and texts(req) == ["a7"]


def test_backtrack_to_a_label_this_path_did_not_pass_stops_with_a_log(wasm):
    prog = P.seq(P.select([P.label("L", P.const("x")), "y"]), P.backtrack("L", "z"))
    trace, req = run(wasm, prog, "y")
    assert texts(req) == ["y"]
    assert 'program: backtrack: label "L" was not passed on the way here' in "".join(req.sequences[0].logs)


def test_backtrack_without_the_capability_is_refused_naming_the_step(wasm):
    prog = P.seq(P.label("L", "x"), P.backtrack("L", "y"))
    tok = ScriptedBackend().tokenizer
    with Engine(ScriptedBackend(script="x")) as eng:
        req = eng.add_request(tok.encode("Q"), wasm, prog.dumps().encode(),
                              capabilities=Capabilities.FF_TOKENS | Capabilities.CONDITIONAL_FF_TOKENS)
        list(eng.run())
    why = "at /elements/1: backtrack needs capability `backtrack`, which this host did not grant"
    assert "program: " + why in "".join(req.sequences[0].logs)
    assert P.capability_refusal(prog.to_json(), Capabilities.FF_TOKENS) == why
    assert P.required_capabilities(prog.to_json()) == {"backtrack": "/elements/1", "ff_tokens": "/elements/1"}
    assert P.capability_refusal(prog.to_json(), Capabilities.ALL) is None


def test_a_json_document_is_completed_in_time_for_the_reply_s_budget(wasm):
    schema = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"},
                                               "c": {"type": "array", "items": {"type": "string"}}},
              "required": ["a", "b"]}
    prog = P.seq("<c>", P.json(schema, complete_by=24, name="v"), "</c>")
    trace, req = run(wasm, prog, '{"a":"' + "x" * 40, max_tokens=24)
    # after 11 tokens the shortest completion ('","b":0}', 8 bytes) and the end tag (4) just fit
    # the 24: one fast-forward closes the string, writes the required "b" (its shortest value)
    # and closes the object; then the end tag; the reply stops, whole, within its budget
    assert trace == [(0, 0, '<c>{"a":"'), (0, 0, "x"), (0, 0, "x"), (0, 0, '","b":0}'), (0, 0, "</c>")]
    assert texts(req) == ['<c>{"a":"xx","b":0}</c>'] and req.variables == {"v": b'{"a":"xx","b":0}'}
    assert req.sequences[0].finish_reason == "stop" and len(req.sequences[0].output_tokens) == 23
    # a number that could go on is closed when only its closing and the "!" fit
    prog = P.seq(P.json({"type": "object", "properties": {"n": {"type": "number"}}, "required": ["n"]},
                        complete_by=12), "!")
    trace, req = run(wasm, prog, '{"n":1234567890123', max_tokens=12)
    assert trace == [(0, 0, '{"n":'), (0, 0, "1"), (0, 0, "2"), (0, 0, "3"), (0, 0, "4"), (0, 0, "}"), (0, 0, "!")]
    assert req.sequences[0].finish_reason == "stop"
