"""The official JSON Schema Test Suite (npm `json-schema-test-suite`: drafts 3 and 4, the
package's newest) through the `json` controller and llguidance, same schemas, same instances.

Each test group is a schema and instances with their expected verdict. Ours: the json controller
through aicirt.Runtime (a byte vocabulary: one token a byte, so no tokenization question), its
first call compiles, each instance written token by token under the masks (as the controller
writes it: compact, keys in schema order; `--any-order`: the instance's own order with the option
any_order), accepted when every token is allowed and then EOS. llguidance: the same schema as a
Lark `%json` lexeme made compact by `x-guidance` (forcing off), the same bytes consumed, accepting
at the end. A test passes when the verdict is the expected one; a schema an engine refuses fails
its tests (counted apart as `refused`). `invalid_accepted`: instances the suite calls invalid
that an engine accepted (soundness; ours should be 0 where it compiles).

Figures per draft (required tests; `optional/` apart): tests, pass_pct (all tests), pass_pct_compiled
(tests of schemas it compiled), refused_pct, invalid_accepted, for ours and llguidance (llg_...).
The last line is one JSON object with every draft.

Usage: python bench/json_test_suite.py [--suite DIR] [--any-order] [--optional]
  --suite: the unpacked package (its tests/ folder); default: `npm pack json-schema-test-suite`
  into a temporary folder (the npm registry must be reachable).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "grammars"))

from _json_cases import Checker, VocabTokenizer, given_text, instance_text  # noqa: E402
from harness import LLG_PREAMBLE, byte_vocab  # noqa: E402

XG = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


def suite_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    tmp = Path(tempfile.mkdtemp(prefix="jsts-"))
    out = subprocess.run(["npm", "pack", "json-schema-test-suite", "--pack-destination", str(tmp)], check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
    with tarfile.open(tmp / out) as t:
        t.extractall(tmp, filter="data")
    return tmp / "package"


class Llg:
    def __init__(self):
        import llguidance
        self.llg, self.tok = llguidance, byte_vocab().llg

    def compile(self, schema):
        if not isinstance(schema, dict):
            schema = {} if schema is True else {"not": {}}
        g = LLG_PREAMBLE + "start: %json " + json.dumps({**schema, "x-guidance": XG}) + "\n"
        m = self.llg.LLMatcher(self.tok, self.llg.LLMatcher.grammar_from_lark(g))
        return None if m.is_error() else m

    def accepts(self, m, text: bytes) -> bool:
        m = m.deep_copy()
        toks = list(text)
        return m.try_consume_tokens(toks) == len(toks) and m.is_accepting()


def count(c: dict, prefix: str, ok: bool | None, valid: bool) -> bool:
    """One verdict into the counters (`ok` None: the engine refused the schema); True if it passed."""
    if ok is None:
        c[prefix + "refused"] += 1
        return False
    good = ok == valid
    c[prefix + "compiled_tests"] += 1
    c[prefix + "pass"] += good
    c[prefix + "compiled_pass"] += good
    c[prefix + "invalid_accepted"] += ok and not valid
    return good


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default=None)
    ap.add_argument("--any-order", action="store_true")
    ap.add_argument("--optional", action="store_true", help="the optional/ tests too (counted apart)")
    a = ap.parse_args()
    from aicirt.build.toolchain import build_cached
    root = suite_dir(a.suite) / "tests"
    tok = VocabTokenizer([bytes([i]) for i in range(256)] + [b""], 256)
    opts = b"\0fast_forward=0" + (b"\0any_order" if a.any_order else b"")
    ours, llg = Checker(tok, build_cached("json").read_bytes(), options=opts), Llg()
    result = {"bench": "json_test_suite", "any_order": a.any_order, "drafts": {}}
    try:
        for draft in sorted(p.name for p in root.iterdir() if p.is_dir()):
            parts = [("", sorted((root / draft).glob("*.json")))]
            if a.optional:
                parts.append(("/optional", sorted((root / draft / "optional").glob("*.json"))))
            for suffix, files in parts:
                c = {k: 0 for k in ("tests", "pass", "refused", "compiled_tests", "compiled_pass", "invalid_accepted",
                                    "llg_pass", "llg_refused", "llg_compiled_tests", "llg_compiled_pass",
                                    "llg_invalid_accepted")}
                for f in files:
                    file_pass = file_llg = file_n = 0
                    for group in json.loads(f.read_text(encoding="utf-8")):
                        schema, tests = group["schema"], group["tests"]
                        h, err, _ = ours.open(schema)
                        lm = llg.compile(schema)
                        try:
                            for t in tests:
                                c["tests"] += 1
                                file_n += 1
                                try:
                                    text = given_text(t["data"]) if a.any_order else instance_text(schema, t["data"])
                                except (ValueError, RecursionError, TypeError):
                                    text = given_text(t["data"])
                                file_pass += count(c, "", None if err else ours.accepts(h, text)[0], t["valid"])
                                file_llg += count(c, "llg_", None if lm is None else llg.accepts(lm, text), t["valid"])
                        finally:
                            ours.close_handle(h)
                    print(f"{draft}{suffix}/{f.name}: {file_n} tests, ours pass {file_pass}, llguidance {file_llg}",
                          flush=True)
                n = c["tests"] or 1
                r = {"tests": c["tests"],
                     "pass_pct": round(100 * c["pass"] / n, 2),
                     "pass_pct_compiled": round(100 * c["compiled_pass"] / max(1, c["compiled_tests"]), 2),
                     "refused_pct": round(100 * c["refused"] / n, 2), "invalid_accepted": c["invalid_accepted"],
                     "llg_pass_pct": round(100 * c["llg_pass"] / n, 2),
                     "llg_pass_pct_compiled": round(100 * c["llg_compiled_pass"] / max(1, c["llg_compiled_tests"]), 2),
                     "llg_refused_pct": round(100 * c["llg_refused"] / n, 2),
                     "llg_invalid_accepted": c["llg_invalid_accepted"]}
                result["drafts"][draft + suffix] = r
                print(f"== {draft}{suffix}: {json.dumps(r)}", flush=True)
    finally:
        ours.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
