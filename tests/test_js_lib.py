"""The js controller's async library (controllers/js/lib.js, docs/js.md): scripts written with
`aici.start`, `gen`, `$`, `fork`, `waitVars` and labels give the same token traces on the scripted
engine as the same jobs written against the low-level midProcess API (controllers/js/examples/
library/*_by_hand.js) and, where the job is the C regex controller's, as that controller; promise
jobs run between calls (async midProcess); module scripts import the library."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from aicirt.engine import Engine, SamplingParams
from aicirt.engine.backends.scripted import ScriptedBackend
from aicirt.build.toolchain import CONTROLLERS_DIR, build_cached
from test_js import C, EOS, GRANTS, js_arg, run_js, trace

LIB = CONTROLLERS_DIR / "js" / "examples" / "library"


@pytest.fixture(scope="module")
def js_wasm():
    return str(build_cached("js"))


def lib_vs_hand(js_wasm, name, arg: bytes, script, caps):
    lib = trace(js_wasm, js_arg((LIB / f"{name}.js").read_bytes(), arg), script, caps)
    hand = trace(js_wasm, js_arg((LIB / f"{name}_by_hand.js").read_bytes(), arg), script, caps)
    assert lib == hand
    assert all(reason != "error" for _, _, reason, _, _ in lib[0]), lib[0]
    return lib


GEN_CASES = [
    ({"options": ["red", "green", "blue"], "storeVar": "v"}, "green", b"green"),
    ({"options": ["Paris, France", "Paris, Texas", "Rome"], "storeVar": "v"}, "Paris, Texas", b"Paris, Texas"),
    ({"regex": "(19|20)[0-9]{2}", "storeVar": "v"}, "1945", b"1945"),
    ({"regex": "[0-9]+", "storeVar": "v"}, list(b"12") + [EOS], b"12"),
    ({"regex": "[a-z ]+\\.", "stopAt": " ", "storeVar": "v"}, "ab cd.", b"ab"),
    ({"stopAt": "\n", "maxTokens": 8, "storeVar": "v"}, "hello\nworld", b"hello"),
    ({"maxTokens": 3, "storeVar": "v"}, "hello", b"hel"),
    ({"regex": "ab|cd", "storeVar": "v"}, "zz", b"ab"),   # the scripted engine takes an allowed token
]


@pytest.mark.parametrize("caps", GRANTS, ids=lambda c: (c.name or "none").lower())
@pytest.mark.parametrize("opts,script,want", GEN_CASES, ids=range(len(GEN_CASES)))
def test_gen_traces_like_the_low_level_api(js_wasm, caps, opts, script, want):
    seqs, variables, _ = lib_vs_hand(js_wasm, "gen", json.dumps(opts).encode(), script, caps)
    eos_back = C.CONDITIONAL_FF_TOKENS | C.BACKTRACK
    if isinstance(script, list) and EOS in script and caps & eos_back != eos_back:
        want = None     # EOS ends the sequence where no splice may take it back
    assert variables.get("v") == want


@pytest.mark.parametrize("caps", [C.ALL, C.ALL & ~(C.FF_TOKENS | C.CONDITIONAL_FF_TOKENS)], ids=["all", "no-ff"])
@pytest.mark.parametrize("arg", [b"red\ngreen\nblue", b"alpha"])
def test_fork_and_wait_vars_trace_like_the_low_level_api(js_wasm, caps, arg):
    seqs, variables, _ = lib_vs_hand(js_wasm, "fork", arg, "", caps)
    assert variables["choices"] == b"".join(o + b"\n" for o in arg.split(b"\n"))
    assert len(seqs) == len(arg.split(b"\n")) + 1


@pytest.mark.parametrize("pattern,script", [(b"(19|20)[0-9]{2}", "1945"), (b"[0-9]+", list(b"12") + [EOS]),
                                            (b"ab|cd", "zz")])
def test_gen_without_ff_traces_like_the_c_regex_controller(js_wasm, pattern, script):
    caps = C.ALL & ~(C.FF_TOKENS | C.CONDITIONAL_FF_TOKENS)
    lib = trace(js_wasm, js_arg(b"aici.start(() => gen({regex: aici.arg()}));", pattern), script, caps)
    c = trace(str(build_cached("regex")), pattern, script, caps)
    assert lib == c


def test_fast_forward_saves_forward_passes(js_wasm):
    """Options: the tokens after the first are fast-forwarded (conditional splices), so a choice
    takes one forward pass where sampling takes one a token."""
    arg = json.dumps({"options": ["Paris, France", "Rome, Italy"], "storeVar": "v"}).encode()
    _, v_all, calls_all = trace(js_wasm, js_arg((LIB / "gen.js").read_bytes(), arg), "Rome, Italy", C.ALL)
    _, v_none, calls_none = trace(js_wasm, js_arg((LIB / "gen.js").read_bytes(), arg), "Rome, Italy", C.NONE)
    assert v_all["v"] == v_none["v"] == b"Rome, Italy"
    assert len(calls_all) == 2 and len(calls_none) == 1 + len("Rome, Italy")   # the prompt, then each token


def test_fixed_text_labels_and_prompt(js_wasm):
    script = r"""
    aici.start(async () => {
      const p = getPrompt();
      await $`A${1 + 1}:`;
      const l = new Label();
      await gen({regex: "x+", maxTokens: 2});
      const first = l.textSince();
      await l.fixedAfter("yz");
      setVar("out", JSON.stringify({p, first, after: l.textSince(), all: aici.detokenize(getTokens())}));
    });"""
    seqs, variables, _ = trace(js_wasm, js_arg(script), "A2:xx", C.ALL)
    assert json.loads(variables["out"]) == {"p": "Q: ", "first": "xx", "after": "yz", "all": "Q: A2:yz"}
    assert seqs[0][1][-5:] == list(b"A2:yz") and seqs[0][2] == "stop"


def test_eos_ending_a_gen_is_taken_back_so_the_script_goes_on(js_wasm):
    script = r"""aici.start(async () => { await gen({regex: "[0-9]+", storeVar: "n"}); await $` done`; });"""
    seqs, variables, _ = trace(js_wasm, js_arg(script), list(b"42") + [EOS], C.ALL)
    assert variables["n"] == b"42" and seqs[0][4] == b"42 done" and seqs[0][2] == "stop"


def test_async_mid_process_runs_its_promise_jobs():
    script = r"""
    async function midProcess(arg) {
      const v = await Promise.resolve(arg.callIndex).then(x => x + 1);
      await null;
      aici.log("call", v);
      return v < 2 ? aici.sample(new aici.TokenSet([65])) : aici.stop();
    }"""
    results, log = run_js(script, steps=4)
    assert [r.status for r in results] == ["ok", "ok"] and results[-1].branches == []
    assert "call 1" in log and "call 2" in log


@pytest.mark.parametrize("script,needle", [
    ("async function midProcess() { throw new TypeError('late'); }", "TypeError: late"),
    ("async function midProcess() { await new Promise(() => {}); }", "still pending"),
    ("aici.start(async () => { await gen({regx: 'a'}); });", "unknown option 'regx'"),
    ("aici.start(async () => { await gen({maxTokens: 1.5}); });", "maxTokens must be an integer"),
    ("aici.start(async () => { await gen({temperature: NaN}); });", "temperature must be a finite number"),
    ("aici.start(async () => { gen({}); await gen({}); });", "two steps at once"),
    ("aici.start(async () => { await fork(0); });", "fork: n must be an integer"),
    ("aici.start(async () => { await waitVars('never', {maxSteps: 1}); });", "never still unset after 1 steps"),
    ("aici.start(async () => { await gen({options: ['a', '']}); });", "options[1] is empty"),
    ("aici.start(1);", "aici.start: expected an (async) function"),
    ("const x = 1;", "defines no function midProcess"),
])
def test_library_misuse_ends_the_sequence_with_a_message(script, needle):
    results, log = run_js(script, steps=4)
    assert results[-1].status == "error", (results, log)
    assert needle in (results[-1].error or "") + log, (results[-1].error, log)


@pytest.mark.parametrize("decl", ["const midProcess = () => aici.stop();", "let midProcess = () => aici.stop();",
                                  "var midProcess = () => aici.stop();", "function midProcess() { return aici.stop(); }",
                                  "export function midProcess() { return aici.stop(); }",
                                  "import {stop} from 'aici';\nexport const midProcess = () => stop();",
                                  "import {start, gen} from 'aici';\nstart(async () => { await gen({maxTokens: 1}); });"])
def test_every_form_of_mid_process_is_found(decl):
    results, log = run_js(decl, steps=3)
    assert results[-1].status == "ok" and results[-1].branches == [], (results[-1].error, log)


def test_a_module_may_import_only_the_library():
    results, log = run_js("import fs from 'fs';\nexport function midProcess() {}")
    assert results[-1].status == "error" and "the only module is \"aici\"" in results[-1].error + log


# -- values checked, not coerced (aici.d.ts) ------------------------------------------------------
BAD_IDS = [("65.5", "65.5 is not an integer"), ("2 ** 32 + 1", "4294967297 is not an integer"),
           ("NaN", "NaN is not an integer"), ('"68"', "expected an integer from 0 to 256, got a string"),
           ("-1", "-1 is not an integer"), ("256 + 1", "257 is not an integer from 0 to 256"),
           ("Infinity", "Infinity is not an integer"), ("null", "got null")]
ID_USES = {
    "ffTokens": "return aici.fastForward([{v}]);",
    "whenSampled": "return {{branches: [{{sampleMask: new aici.TokenSet([65]), splices: [{{whenSampled: [{v}], ffTokens: []}}]}}]}};",
    "TokenSet": "new aici.TokenSet([{v}]); return aici.stop();",
    "allow": "new aici.TokenSet().allow({v}); return aici.stop();",
    "has": "new aici.TokenSet().has({v}); return aici.stop();",
    "tokenBytes": "aici.tokenBytes({v}); return aici.stop();",
    "detokenize": "aici.detokenize([{v}]); return aici.stop();",
    "advance": "const r = new aici.Regex('a+'); r.advance(r.start(), [{v}]); return aici.stop();",
}


@pytest.mark.parametrize("use", ID_USES)
@pytest.mark.parametrize("value,message", BAD_IDS, ids=[v for v, _ in BAD_IDS])
def test_every_token_id_is_checked_not_coerced(use, value, message):
    results, log = run_js("function midProcess(arg) { " + ID_USES[use].format(v=value) + " }", steps=1)
    assert results[-1].status == "error", (use, value, results[-1])
    assert message in results[-1].error, (use, value, results[-1].error)


@pytest.mark.parametrize("value,message", [("-1", "-1 is not an integer from 0 to 4294967295"),
                                           ("1.5", "1.5 is not an integer"), ("2 ** 32", "4294967296 is not an integer"),
                                           ('"1"', "got a string"), ("NaN", "NaN is not an integer")])
def test_backtrack_is_checked(value, message):
    results, _ = run_js(f"function midProcess() {{ return aici.fastForward([], {value}); }}", steps=1)
    r = results[-1]
    assert r.status == "error" and "branches[0].splices[0].backtrack: " in r.error and message in r.error, r.error


@pytest.mark.parametrize("value,message", [("NaN", "NaN is not a finite number >= 0"), ("-1", "-1 is not a finite"),
                                           ("Infinity", "Infinity is not a finite"), ('"0.5"', "a string is not")])
def test_temperature_is_checked(value, message):
    results, _ = run_js(f"function midProcess() {{ return aici.sample(new aici.TokenSet([65]), {{temperature: {value}}}); }}",
                        steps=1)
    assert results[-1].status == "error" and message in results[-1].error, results[-1].error


def test_inherited_properties_are_not_read():
    script = """
    Object.prototype.splices = [{backtrack: 0, ffTokens: [1, 2, 3]}];
    Object.prototype.temperature = 99;
    function midProcess() { return {branches: [{sampleMask: new aici.TokenSet([65])}]}; }"""
    results, _ = run_js(script, steps=1)
    assert results[0].status == "ok", results[0].error
    (b,) = results[0].branches
    assert b.splices == () and b.temperature is None


# -- errors that name the JS line ------------------------------------------------------------------
@pytest.mark.parametrize("recurse", ["function f(n) { return f(n + 1) + 1; }",
                                     "function f(n) { return [1].map(() => f(n + 1)); }",
                                     "function f(n) { return String({toString() { return f(n + 1); }}); }"])
def test_stack_overflow_is_a_catchable_range_error_with_the_line(recurse):
    script = recurse + """
    function midProcess() {
      try { f(0); } catch (e) { aici.log("caught", e.name, e.message, e.stack.split("\\n")[1].trim()); }
      return aici.stop();
    }"""
    results, log = run_js(script, steps=1)
    assert results[0].status == "ok", results[0].error
    assert "caught RangeError Maximum call stack size exceeded at " in log and "<script>:1:" in log, log


@pytest.mark.parametrize("throw,needle", [
    ("throw Symbol('sym');", "midProcess threw: a thrown Symbol(sym)"),
    ("throw {toString() { throw new Error('x'); }};", "a thrown value (an object) whose conversion to a string threw"),
    ("throw new Proxy({}, {get() { throw new Error('trap'); }});", "a thrown value (a Proxy of an object) whose conversion"),
    ("throw 42;", "midProcess threw: 42"),
    ("throw null;", "midProcess threw: null"),
])
def test_every_thrown_value_is_described_truthfully(throw, needle):
    results, log = run_js("function midProcess() { " + throw + " }", steps=1)
    assert results[0].status == "error" and needle in results[0].error, results[0].error
    assert "out of memory" not in results[0].error


def test_the_docs_library_example_runs(js_wasm):
    doc = (Path(__file__).resolve().parent.parent / "docs" / "js.md").read_text()
    block = doc.split("## The async library", 1)[1].split("```js\n", 1)[1].split("```", 1)[0]
    text = list(b"Q: City: Tokyo\nYear founded: 1603\nOne line about it: big.\n\nFact 1: old.")
    backend = ScriptedBackend(script=text + [0] * 64)
    eng = Engine(backend)
    try:
        req = eng.generate("Q: ", controller=js_wasm, arg=js_arg(block), chat=False, params=SamplingParams(max_tokens=500))
    finally:
        eng.close()
    seqs = [(s.label, s.tokens, s.finish_reason, s.error, s.text_bytes) for s in req.sequences]
    variables = req.variables
    assert all(reason != "error" for _, _, reason, _, _ in seqs), seqs
    assert variables["city"] == b"Tokyo" and variables["year"] == b"1603" and len(seqs) == 3
    assert variables["summary"].startswith(b"Tokyo: ")


# -- the CLI: TypeScript, syntax errors with line and column, --json -------------------------------
TS = """import {start, gen, $} from "aici";

interface Pick { name: string; n: number }
type Opts = string[];
const OPTS: Opts = ["red", "green", "blue"];

function label(p: Pick): string {
  return `${p.name}:${p.n}`;
}

start(async (): Promise<void> => {
  await $`Color: `;
  const c: string = await gen({options: OPTS, storeVar: "color"});
  aici.varSet("label", label({name: c, n: c.length} as Pick));
});
"""


def test_typescript_builds_runs_and_names_the_ts_line(tmp_path):
    from click.testing import CliRunner

    from cli import main
    src = tmp_path / "pick.ts"
    src.write_text(TS)
    r = CliRunner().invoke(main, ["run", str(src), "--model", "scripted", "--prompt", "x", "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)["variables"]
    assert got["label"] == f"{got['color']}:{len(got['color'])}" and got["color"] in ("red", "green", "blue")
    # a runtime error's stack names the .ts line: the stripper keeps every line where it was
    src.write_text(TS.replace("  return `${p.name}:${p.n}`;", "  throw new Error(`no ${p.name}`);"))
    r = CliRunner().invoke(main, ["run", str(src), "--model", "scripted", "--prompt", "x", "--json"])
    seq = json.loads(r.stdout)["sequences"][0]
    assert "Error: no " in seq["error"] and "at label (<script>:8:" in seq["error"], seq["error"]
    bad = tmp_path / "bad.ts"
    bad.write_text("let ok: number = 1;\nlet x: = 2;\n")
    r = CliRunner().invoke(main, ["build", str(bad), "-o", str(tmp_path / "bad.wasm")])
    assert r.exit_code != 0 and f"{bad}:2:8: Unexpected token" in r.output, r.output


@pytest.mark.parametrize("cmd", ["build", "check", "upload"])
def test_build_check_and_upload_report_a_syntax_error_with_line_and_column(tmp_path, cmd):
    from click.testing import CliRunner

    from cli import main
    bad = tmp_path / "bad.js"
    bad.write_text("function midProcess(arg) {\n  return aici.stop(;\n}\n")
    extra = {"build": ["-o", str(tmp_path / "x.wasm")], "check": [], "upload": ["--store", str(tmp_path / "s")]}[cmd]
    r = CliRunner().invoke(main, [cmd, str(bad), *extra])
    assert r.exit_code != 0 and f"{bad}:2:20: SyntaxError" in r.output, r.output
    good = tmp_path / "good.js"
    good.write_text("export const midProcess = () => aici.stop();\n")
    r = CliRunner().invoke(main, [cmd, str(good), *extra])
    assert r.exit_code == 0, r.output


def test_run_json_prints_one_object_when_the_build_fails(tmp_path):
    from click.testing import CliRunner

    from cli import main
    bad = tmp_path / "bad.js"
    bad.write_text("function midProcess( {")
    r = CliRunner().invoke(main, ["run", str(bad), "--model", "scripted", "--prompt", "x", "--json"])
    assert r.exit_code != 0
    got = json.loads(r.stdout)
    assert list(got) == ["error"] and "bad.js:1:" in got["error"] and "SyntaxError" in got["error"]


# -- aici.Grammar: the grammar controller's Lark/GBNF matcher ---------------------------------------
GRAMMARS = [
    ('start: "The answer is " ("yes" | "no" | NUMBER) "."\nNUMBER: /[0-9]+/', "The answer is 42.", b""),
    ('root ::= "x=" [0-9]+ ";"', "x=17;", b""),
    ('start: "a" "b"', "ab", b"\0lark"),
    ('start: item+\nitem: "(" NAME ")"\nNAME: /[a-z]+/', list(b"(ab)(c)") + [EOS], b""),
]


@pytest.mark.parametrize("grammar,script,opt", GRAMMARS, ids=range(len(GRAMMARS)))
def test_gen_with_a_grammar_traces_like_the_c_grammar_controller(js_wasm, grammar, script, opt):
    caps = C.ALL & ~(C.FF_TOKENS | C.CONDITIONAL_FF_TOKENS)
    syntax = "{syntax: 'lark'}" if opt else "undefined"
    lib = trace(js_wasm, js_arg(f"aici.start(() => gen({{grammar: new aici.Grammar(aici.arg(), {syntax})}}));",
                                grammar.encode()), script, caps)
    c = trace(str(build_cached("grammar")), grammar.encode() + opt, script, caps)
    assert lib == c
    assert all(reason != "error" for _, _, reason, _, _ in lib[0]), lib[0]


def test_grammar_gen_fast_forwards_forced_text(js_wasm):
    g = GRAMMARS[0][0]
    seqs, variables, calls = trace(js_wasm, js_arg('aici.start(() => gen({grammar: aici.arg(), storeVar: "v"}));',
                                                   g.encode()), "The answer is 42.", C.ALL)
    assert variables["v"] == b"The answer is 42." and len(calls) == 5   # prompt, forced text, 4, 2, .


def test_grammar_api_states_and_errors():
    script = r"""
    function midProcess() {
      const g = new aici.Grammar('start: "ab" | "ac"');
      const s0 = g.start(), s1 = g.advance(s0, aici.tokenize("a")), s2 = g.advance(s1, aici.tokenize("b"));
      const out = {acc: g.accepting(s2), cont: g.canContinue(s1), mask: g.mask(s1).tokens(), dead: g.advance(s1, aici.tokenize("x"))};
      const s3 = g.advance(s1, aici.tokenize("c"));       // from s1 again: s2 leaves the path
      try { g.mask(s2); } catch (e) { out.off = e.message; }
      out.acc3 = g.accepting(s3);
      try { new aici.Grammar('start: foo'); } catch (e) { out.bad = e.name + ": " + e.message; }
      try { new aici.Grammar('start: "a"', {syntax: "ebnf"}); } catch (e) { out.syntax = e.message; }
      aici.log(JSON.stringify(out));
      return aici.stop();
    }"""
    results, log = run_js(script, steps=1)
    assert results[0].status == "ok", results[0].error
    got = json.loads(log.strip().splitlines()[-1])
    assert got["acc"] and got["cont"] and got["acc3"] and got["dead"] == 0
    assert got["mask"] == sorted(set(b"bc")), got
    assert "off the grammar's path" in got["off"]
    assert got["bad"].startswith("SyntaxError: Grammar: ") and "foo" in got["bad"]
    assert 'syntax must be "lark" or "gbnf"' in got["syntax"]


# -- the fuzzer: random capabilities, backtracks, late steps and forks against library scripts -----
def _fuzz_check_regex(s):
    import re
    text = s.text_bytes
    if s.finish_reason == "stop" and not re.fullmatch(rb"(19|20)[0-9]{2}", text):
        return f"stopped on {text!r}, not a complete match"
    return re.fullmatch(rb"(19|20)[0-9]{0,2}|1|2", text) is not None or not text or f"{text!r} is no prefix of a match"


FUZZ_SCRIPTS = {
    "gen_regex": ('aici.start(() => gen({regex: "(19|20)[0-9]{2}"}));', _fuzz_check_regex),
    "choice_then_text": ('aici.start(async () => { await gen({options: ["red", "green", "blue"], storeVar: "c"}); '
                         'await $` ok`; });',
                         lambda s: s.finish_reason != "stop" or s.text_bytes in (b"red ok", b"green ok", b"blue ok")
                         or "the host took back" in s.logs or f"stopped on {s.text_bytes!r}"),
    "fork_wait": ('aici.start(async () => { if (!(aici.capabilities() & aici.Cap.FORK)) return; const i = await fork(3); if (i) { await $`#${i}`; setVar(`v${i}`, "x"); '
                  'return; } await waitVars("v1", "v2", {maxSteps: 200}); await $`done`; });', None),
}


@pytest.mark.parametrize("name", FUZZ_SCRIPTS)
def test_the_fuzzer_finds_no_fault_in_library_scripts(js_wasm, name):
    from aicirt.testing import fuzz
    script, check = FUZZ_SCRIPTS[name]
    report = fuzz(js_wasm, js_arg(script), steps=300, seed=5, check=check, shrink=False)
    errors = [f for f in report.failures if not ("waitVars" in str(f) and name == "fork_wait")]
    assert not errors, report
    assert report.runs >= 3, report
