"""The js controller (controllers/js, docs/js.md): the shipped yesno, choice and regex behaviours
written in JavaScript (controllers/js/examples) give the same token traces as the C controllers
on the scripted engine, under each capability grant; the API's contract; errors in a script end
the sequence with the JS message and stack. One QuickJS build (cached) serves every test."""
from __future__ import annotations

import json

import pytest

import aicirt
from aicirt import StepInput
from aicirt.engine import Engine
from aicirt.engine.backends.scripted import ScriptedBackend
from aicirt.build.toolchain import CONTROLLERS_DIR, build_cached

EOS = 256
C = aicirt.Capabilities
EXAMPLES = CONTROLLERS_DIR / "js" / "examples"
GRANTS = [C.ALL, C.NONE, C.ALL & ~(C.FF_TOKENS | C.CONDITIONAL_FF_TOKENS), C.ALL & ~C.CONDITIONAL_FF_TOKENS,
          C.ALL & ~C.FORK]


@pytest.fixture(scope="session")
def js_wasm():
    return str(build_cached("js"))


@pytest.fixture(scope="session")
def c_wasm():
    return {name: str(build_cached(name)) for name in ("yesno", "choice", "regex")}


def js_arg(script: str | bytes, arg: bytes = b"") -> bytes:
    """The js controller's argument: the script, then NUL and the script's own argument."""
    return (script.encode() if isinstance(script, str) else script) + b"\0" + arg


def trace(wasm, arg: bytes, script, caps, prompt="Q: "):
    """Everything the engine did: each forward batch's (sequence, tokens), each sequence's end,
    and the variables."""
    toks = list(prompt.encode()) + (list(script.encode()) if isinstance(script, str) else list(script))
    backend = ScriptedBackend(script=toks + [0] * 64)
    eng = Engine(backend)
    try:
        req = eng.generate(prompt, controller=wasm, arg=arg, chat=False, capabilities=caps)
    finally:
        eng.close()
    seqs = [(s.label, s.tokens, s.finish_reason, s.error, s.text_bytes) for s in req.sequences]
    return seqs, req.variables, [[toks for _, toks in batch] for batch in backend.calls]


def same_trace(c_wasm, js_wasm, name, arg, script, caps, example=None):
    c = trace(c_wasm[name], arg, script, caps)
    js = trace(js_wasm, js_arg((EXAMPLES / f"{example or name}.js").read_bytes(), arg), script, caps)
    assert js == c
    assert all(reason != "error" for _, _, reason, _, _ in c[0]), c[0]
    return c


@pytest.mark.parametrize("caps", GRANTS, ids=lambda c: (c.name or "none").lower())
@pytest.mark.parametrize("arg,script", [(b"", "Yes"), (b"", "No"), (b"maybe\nnever", "never")])
def test_yesno_in_js_traces_like_c(c_wasm, js_wasm, caps, arg, script):
    seqs, variables, _ = same_trace(c_wasm, js_wasm, "yesno", arg, script, caps)
    assert variables["answer"] in (b"yes", b"no")


@pytest.mark.parametrize("caps", GRANTS, ids=lambda c: (c.name or "none").lower())
@pytest.mark.parametrize("arg,script", [(b"red\ngreen\nblue", "green"), (b"abc\nab", list(b"ab") + [EOS]),
                                        (b"", "x")])
def test_choice_in_js_traces_like_c(c_wasm, js_wasm, caps, arg, script):
    seqs, variables, _ = same_trace(c_wasm, js_wasm, "choice", arg, script, caps)
    assert "choices" in variables


@pytest.mark.parametrize("caps", [C.ALL, C.NONE])
@pytest.mark.parametrize("pattern,script", [(b"(19|20)[0-9]{2}", "1945"), (b"[a-z]+@[a-z]+\\.com", "ann@x.com"),
                                            (b"[0-9]+", list(b"12") + [EOS]), (b"ab|cd", "zz")])
@pytest.mark.parametrize("example", ["regex", "regex_by_hand"])   # aici.Follower, and the loop in JS
def test_regex_in_js_traces_like_c(c_wasm, js_wasm, caps, pattern, script, example):
    same_trace(c_wasm, js_wasm, "regex", pattern, script, caps, example)


# -- the API -------------------------------------------------------------------------------------
def run_js(script: str, arg: bytes = b"", steps: int = 3, prompt=(1, 2), hot_path_rt=None):
    rt = hot_path_rt or aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False)
    try:
        seq = rt.new_request(rt.load(build_cached("js")), js_arg(script, arg)).spawn()
        tokens = list(prompt)
        results = [rt.submit([StepInput(seq, tokens)]).wait().results[0]]
        for _ in range(steps - 1):
            if results[-1].status != "ok" or not results[-1].branches:
                break
            tokens = tokens + [65]
            results.append(rt.submit([StepInput(seq, tokens, 65)]).wait().results[0])
        return results, seq.log.decode()
    finally:
        if hot_path_rt is None:
            rt.close()


def test_api_tokens_sets_and_variables(make_rt):
    script = r"""
    function midProcess(arg) {
      const t = new aici.TokenSet([1, 2, 3]).allowRange(10, 12).deny(2);
      const u = t.copy().and(new aici.TokenSet([3, 10, 99]));
      aici.varSet("v", "é" + aici.vocabSize());
      aici.varAppend("v", "!");
      console.log(JSON.stringify({toks: t.tokens(), n: t.count(), u: u.tokens(), has: t.has(11), empty: u.isEmpty(),
                                  size: t.size(), eos: aici.eosToken(), det: aici.detokenize(aici.tokenize("hi")),
                                  v: aici.varGet("v"), none: aici.varGet("nope") === undefined, arg: aici.arg(),
                                  bytes: Array.from(aici.tokenBytes(65)), bt: arg.backtrack, tok: arg.tokens,
                                  caps: aici.capabilities(), sampled: arg.sampled === undefined,
                                  all: aici.allTokens()}));
      return aici.stop();
    }"""
    results, log = run_js(script, b"the-arg", hot_path_rt=make_rt())
    assert results[0].status == "ok" and results[0].branches == [], results[0].error
    import json
    got = json.loads(log.strip().splitlines()[-1])
    assert got == {"toks": [1, 3, 10, 11], "n": 4, "u": [3, 10], "has": True, "empty": False, "size": 257,
                   "eos": 256, "det": "hi", "v": "é257!", "none": True, "arg": "the-arg", "bytes": [65], "bt": 0,
                   "tok": [1, 2], "caps": int(C.ALL), "sampled": True, "all": [1, 2]}


def test_follower_follows_backtracking_and_skipped_calls_and_refuses_misuse(make_rt):
    """Follower.step() compares the tokens with those it followed, so a backtrack (even one made
    on a call that did not step it) is followed; its result converts natively and shows its
    plain form; misuse throws."""
    script = r"""
    const f = new aici.Follower(new aici.Regex("[A-Z]{1,6}"));
    let msgs = [];
    try { f.step(); } catch (e) { msgs.push(e.message); }
    try { new aici.Follower({}); } catch (e) { msgs.push(e.message); }
    function midProcess(arg) {
      if (arg.callIndex === 2) return aici.noop();               // a call the follower skips
      const r = f.step();
      console.log(JSON.stringify({call: arg.callIndex, state: f.state, n: r.branches.length,
                                  has: r.branches.length ? r.branches[0].sampleMask.has(66) : null, msgs}));
      return r;
    }"""
    rt = make_rt()
    seq = rt.new_request(rt.load(build_cached("js")), js_arg(script)).spawn()
    for tokens, sampled in (([1], None), ([1, 65], 65), ([1, 65, 65, 65], 65), ([1, 66], 66),
                            ([1] + [65] * 6, 65)):
        r = rt.submit([StepInput(seq, tokens, sampled)]).wait().results[0]
        assert r.status == "ok", (r.error, seq.log)
    logs = [json.loads(x) for x in seq.log.decode().strip().splitlines()]
    assert logs[0]["msgs"] == ["Follower.step() is available during midProcess only",
                               "expected an aici.Regex, aici.JsonSchema or aici.Grammar"]
    states = {entry["call"]: entry["state"] for entry in logs}
    assert states[3] == states[1] != states[0]      # "A", then "AAA" on a skipped call, then "B": one letter
    assert [(e["call"], e["n"]) for e in logs] == [(0, 1), (1, 1), (3, 1), (4, 0)]   # 6 letters: complete, stop


def test_regex_api_and_cached_masks_are_read_only(make_rt):
    script = r"""
    function midProcess(arg) {
      const re = new aici.Regex("a[0-9]+");
      const s0 = re.start(), s1 = re.advance(s0, 97), s2 = re.advance(s1, [49, 50]);
      const m = re.mask(s2);
      let ro = "";
      try { m.allow(5); } catch (e) { ro = e.message; }
      let bad = "";
      try { new aici.Regex("(unclosed"); } catch (e) { bad = e.name + ": " + e.message; }
      console.log(JSON.stringify({dead: re.advance(s0, 98), acc: [re.accepting(s1), re.accepting(s2)],
                                  digits: m.has(48) && m.has(57) && !m.has(97), eos: m.has(aici.eosToken()),
                                  ro: ro.includes("read-only"), bad: bad.startsWith("SyntaxError: Regex:")}));
      return aici.sample(m);
    }"""
    results, log = run_js(script, steps=1, hot_path_rt=make_rt())
    import json
    assert results[0].status == "ok", results[0].error
    assert json.loads(log.strip().splitlines()[-1]) == {"dead": 0, "acc": [False, True], "digits": True, "eos": True,
                                                         "ro": True, "bad": True}


def test_randomness_and_clock_are_replayable(make_rt):
    """Math.random draws on WASI random_get (seeded by the request), Date.now on the virtual clock."""
    script = "function midProcess(a) { console.log(Math.random(), Math.random(), Date.now()); return aici.stop(); }"
    rt = make_rt()
    logs = [run_js(script, arg, hot_path_rt=rt)[1] for arg in (b"1", b"1", b"2")]
    assert logs[0] == logs[1] != logs[2]
    assert logs[0].split()[2] == "1"   # the first call: one virtual millisecond


# -- errors in the script end the sequence, saying why ---------------------------------------------
@pytest.mark.parametrize("script,needles", [
    ("function midProcess(a) {", ["the script failed", "SyntaxError"]),
    ("function helper() { throw new TypeError('boom here'); }\nfunction midProcess(a) { return helper(); }",
     ["midProcess threw", "TypeError: boom here", "at helper (<script>:1", "at midProcess (<script>:2"]),
    ("var x = 1;", ["defines no function midProcess"]),
    ("function midProcess(a) { return 42; }", ["wrong shape", "the result is not an object"]),
    ("function midProcess(a) { return {branches: [{sampleMask: [1, 2]}]}; }",
     ["wrong shape", "branches[0]", "sampleMask is not an aici.TokenSet"]),
    ("function midProcess(a) { return {branches: [{sample_mask: 1}]}; }", ["unknown field 'sample_mask'"]),
    ("function midProcess(a) { return {branches: [{splices: [{ffTokens: [999]}]}]}; }",
     ["branches[0].splices[0].ffTokens[0]: 999 is not an integer from 0 to 256"]),
    ("function midProcess(a) { return {branches: [{splices: [{backtrack: 'x'}]}]}; }",
     ["branches[0].splices[0].backtrack: expected an integer from 0 to 4294967295, got a string"]),
])
def test_script_errors_end_the_sequence_with_the_js_message(make_rt, script, needles):
    results, log = run_js(script, hot_path_rt=make_rt())
    r = results[-1]
    assert r.status == "error", (r.status, r.error)
    for n in needles:
        assert n in r.error, (n, r.error)
    assert "\n" not in r.error and "proc_exit(1)" in r.error
    assert needles[-1] in log   # the whole message and stack are in the log


def test_a_fork_copies_the_interpreter(make_rt):
    script = r"""
    let count = 0;
    function midProcess(arg) {
      count++;
      if (arg.callIndex === 0) return {branches: [aici.noop().branches[0], aici.noop().branches[0]]};
      aici.varAppend("seen", `${aici.selfSeqId() === arg.forkGroup[0] ? "p" : "c"}${count}`);
      return aici.stop();
    }"""
    rt = make_rt()
    req = rt.new_request(rt.load(build_cached("js")), js_arg(script))
    seq = req.spawn()
    out = rt.submit([StepInput(seq, [1])]).wait()
    assert out.results[0].status == "ok", out.results[0].error
    children = [s for s in req.sequences if s is not seq]
    assert len(children) == 1
    out = rt.submit([StepInput(s, [1]) for s in req.sequences]).wait()
    assert all(r.status == "ok" for r in out.results), [r.error for r in out.results]
    assert sorted([req.variables["seen"][:2], req.variables["seen"][2:]]) == [b"c2", b"p2"]


# -- a script as a module: aicirt build / run / upload ctrl.js -------------------------------------
def test_a_bound_script_module_runs_the_script_with_the_whole_argument(c_wasm, tmp_path):
    from aicirt.build.toolchain import build
    src = tmp_path / "re.js"
    src.write_bytes((EXAMPLES / "regex.js").read_bytes())
    bound = build(src, tmp_path / "re.wasm", progress=False).path
    for caps in (C.ALL, C.NONE):
        assert trace(str(bound), b"(19|20)[0-9]{2}", "1945", caps) == trace(c_wasm["regex"], b"(19|20)[0-9]{2}",
                                                                           "1945", caps)


def test_binding_refuses_what_it_cannot_bind(js_wasm):
    from aicirt.loader.js_bind import bind
    from aicirt.loader.wasm_binary import WasmFormatError
    wasm = open(js_wasm, "rb").read()
    with pytest.raises(ValueError, match="empty"):
        bind(wasm, b"  \n")
    with pytest.raises(ValueError, match="not UTF-8"):
        bind(wasm, b"\xff\xfe")
    with pytest.raises(WasmFormatError, match="already has a script"):
        bind(bind(wasm, b"function midProcess(a) {}"), b"function midProcess(a) {}")
    with pytest.raises(ValueError, match="NUL byte"):
        bind(wasm, b"function midProcess(a) {}\0")
    with pytest.raises(WasmFormatError, match="not the js controller"):
        bind(open(build_cached("yesno"), "rb").read(), b"function midProcess(a) {}")


def test_a_bound_script_shares_the_js_controllers_compiled_code(js_wasm):
    """Binding compiles nothing: the bound module's code (less its arg-prefix section) is the js
    controller's, so it loads the js controller's compiled snapshot, under its own module id."""
    from aicirt.loader.js_bind import bind, split_arg_prefix
    wasm = open(js_wasm, "rb").read()
    script = b"function midProcess(a) { aici.varSet('arg', aici.arg()); return aici.stop(); }"
    bound = bind(wasm, script)
    assert split_arg_prefix(bound) == (wasm, script + b"\0") and split_arg_prefix(wasm) == (wasm, b"")
    with aicirt.Runtime(aicirt.ByteTokenizer()) as rt:
        js, b1, b2 = rt.load(wasm), rt.load(bound), rt.load(bind(wasm, script + b" // another"))
        assert b1.module is js.module and b2.module is js.module and js.snapshot
        assert len({js.sha256, b1.sha256, b2.sha256}) == 3 and b1.arg_prefix == script + b"\0"
        req = rt.new_request(b1, arg=b"its own")
        out = rt.submit([StepInput(req.spawn(), [1, 2])]).wait()
        assert out.results[0].status == "ok" and not out.results[0].branches, out.results[0].error
        assert req.variables["arg"] == b"its own"


@pytest.mark.slow   # three CLI runs on the scripted engine
def test_cli_runs_and_uploads_js(tmp_path):
    from click.testing import CliRunner

    from cli import main
    src = tmp_path / "yn.js"
    src.write_bytes((EXAMPLES / "yesno.js").read_bytes())
    common = ["--model", "scripted", "--prompt", "x", "--json"]
    r = CliRunner().invoke(main, ["run", "js", "--arg-file", str(src), *common])   # the script as the argument
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["sequences"][0]["finish_reason"] == "stop"
    store = ["--store", str(tmp_path / "store")]
    r = CliRunner().invoke(main, ["upload", str(src), "-t", "yn-js", *store])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["run", "yn-js", "--arg", "maybe\nnever", *common, *store])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["variables"]["answer"] in ("yes", "no")
    bad = tmp_path / "bad.js"
    bad.write_text("function midProcess(a) { return {branches: 1}; }")
    r = CliRunner().invoke(main, ["run", str(bad), *common])
    assert r.exit_code != 0 and "branches is not an array" in r.output, r.output


def test_the_docs_first_example_runs():
    import re as _re
    from pathlib import Path
    doc = Path(__file__).resolve().parent.parent / "docs" / "js.md"
    script = _re.search(r"```js\n(.*?)```", doc.read_text(), _re.S).group(1)
    seqs, _, _ = trace(build_cached("js"), js_arg(script), "1945", C.ALL)
    assert [(reason, text) for _, _, reason, _, text in seqs] == [("stop", b"1945")]


def test_the_docs_follower_example_runs():
    import re as _re
    from pathlib import Path
    doc = Path(__file__).resolve().parent.parent / "docs" / "js.md"
    script = _re.findall(r"```js\n(.*?)```", doc.read_text(), _re.S)[1]
    assert "aici.Follower" in script
    seqs, _, _ = trace(build_cached("js"), js_arg(script), '{"year":1945}', C.ALL)
    assert [(reason, text) for _, _, reason, _, text in seqs] == [("stop", b'{"year":1945}')]
    seqs, _, _ = trace(build_cached("js"), js_arg(script), '{"year":1845}', C.ALL)   # under the minimum
    assert seqs[0][2] != "error" and seqs[0][4] != b'{"year":1845}'


def test_the_vllm_steering_core_runs_a_js_script_as_it_runs_c(c_wasm, js_wasm):
    """The vLLM plugin's engine-independent core (mask-only host: no fork, no backtrack, forced
    fast-forward) gives the js regex.js the same tokens as the C regex controller."""
    from test_vllm_steering import EOS as V_EOS, MaskOnlyHost, backend
    from aicirt.integrations import steering as st
    with aicirt.Runtime(aicirt.ByteTokenizer(), cache_dir=False) as rt:
        outs = []
        for wasm, arg in ((c_wasm["regex"], b"[a-z]+ [a-z]+"),
                          (js_wasm, js_arg((EXAMPLES / "regex.js").read_bytes(), b"[a-z]+ [a-z]+"))):
            host = MaskOnlyHost(st.Steering(rt, V_EOS), backend())
            out = host.add(rt.load(wasm), arg)
            host.run()
            (s, _), = host.done
            assert s.error is None, s.error
            outs.append(bytes(t for t in out if t < 256))
    assert outs[0] == outs[1] and outs[0].startswith(b"e quick"), outs   # the script spells "the quick ..." after "hi"
