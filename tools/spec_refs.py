"""Point every "SPEC §N" in the tree at the protocol page, docs/protocol.md.

The contract used to live outside the repository (a SPEC.md that only some machines had); its
sections now live in docs/protocol.md under stable anchors. This rewrites the old references:

    SPEC §3            -> docs/protocol.md#semantics          (code, tests, bench)
    SPEC §2, §4        -> docs/protocol.md#wit, #limits      ("SPEC §4's" loses its "'s")
    SPEC §3 (in docs/) -> [protocol §3](protocol.md#semantics)  (a link, relative to the page)
    §4 (bare, in code) -> protocol.md#limits

Usage (from the repository root; idempotent, so rerun it after merging branches that added more):

    python tools/spec_refs.py            # rewrite tracked files in place, list what changed
    python tools/spec_refs.py --check    # list what is left, exit 1 if anything is

`tests/test_docs.py` runs the check, so a new "SPEC §N" fails the suite with the line to fix.
Raw benchmark output (bench/results/) and test data are never rewritten: they record what a
command printed.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOCOL = "docs/protocol.md"

#: Old SPEC.md section -> docs/protocol.md anchor (the `<a id>` above each section there).
ANCHORS = {1: "overview", 2: "wit", 3: "semantics", 4: "limits", 5: "implementation", 6: "hosts", 7: "serving"}

SUFFIXES = {".py", ".c", ".h", ".md", ".zig", ".js", ".ts", ".toml", ".cfg", ".wit", ".txt", ".sh"}
SKIP_PREFIXES = ("bench/results/", "tests/data/", PROTOCOL, "tools/spec_refs.py", "tests/test_docs.py")   # the last two quote the old form

_NUM = r"§ ?(\d)"
#: "SPEC §3", "SPEC.md §3", "SPEC §2/§3", "SPEC §2, §4, §5", "SPEC §2 and §4"
SPEC_REF = re.compile(r"SPEC(?:\.md)? ?" + _NUM + r"((?:\s*(?:/|,|and)\s*" + _NUM + r")*)(?:'s)?")
#: a bare "§4" (no SPEC before it): code and tests only, where § was always SPEC's
BARE_REF = re.compile(r"(?<![\w/#])" + _NUM + r"((?:\s*/\s*" + _NUM + r")*)")
#: what --check reports: any SPEC reference left, however written
LEFT = re.compile(r"SPEC(?:\.md)?(?:'s)? ?(?:§|section)|\bthe SPEC\b|§ ?\d")
#: a rewritten link in a doc, which LEFT must not count
_LINK = re.compile(r"\[(?:protocol )?§\d\]\([./]*(?:docs/)?protocol\.md#\w+\)")


def _numbers(first: str, rest: str) -> list[int]:
    return [int(first)] + [int(n) for n in re.findall(r"\d", rest)]


def _code_form(nums: list[int], seps: list[str]) -> str:
    out = f"{PROTOCOL}#{ANCHORS[nums[0]]}"
    for sep, n in zip(seps, nums[1:]):
        out += f"{sep}#{ANCHORS[n]}"
    return out


def _doc_form(nums: list[int], seps: list[str], prefix: str) -> str:
    out = f"[protocol §{nums[0]}]({prefix}protocol.md#{ANCHORS[nums[0]]})"
    for sep, n in zip(seps, nums[1:]):
        out += f"{sep}[§{n}]({prefix}protocol.md#{ANCHORS[n]})"
    return out


def _separators(rest: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"(\s*(?:/|,|and)\s*)§ ?\d", rest)]


def rewrite(path: str, text: str) -> str:
    """`text` (the file at repository path `path`) with its SPEC references pointing at the protocol page."""
    is_doc = path.endswith(".md")
    prefix = "" if path.startswith("docs/") else ("docs/" if "/" not in path else "../" * path.count("/") + "docs/")

    def spec(m: re.Match) -> str:
        nums, seps = _numbers(m.group(1), m.group(2) or ""), _separators(m.group(2) or "")
        return _doc_form(nums, seps, prefix) if is_doc else _code_form(nums, seps)

    text = SPEC_REF.sub(spec, text)
    if not is_doc:
        def bare(m: re.Match) -> str:
            nums, seps = _numbers(m.group(1), m.group(2) or ""), _separators(m.group(2) or "")
            return "protocol.md" + "".join(f"{s}#{ANCHORS[n]}" for s, n in zip([""] + seps, nums))
        text = BARE_REF.sub(bare, text)
    return text


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [p for p in out.splitlines()
            if Path(p).suffix in SUFFIXES and not p.startswith(SKIP_PREFIXES) and (ROOT / p).is_file()]


def leftovers() -> list[str]:
    """`path:line: text` for every SPEC reference still in a tracked file."""
    found = []
    for p in tracked_files():
        for i, line in enumerate((ROOT / p).read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if LEFT.search(_LINK.sub("", line)):
                found.append(f"{p}:{i}: {line.strip()}")
    return found


def main(argv: list[str]) -> int:
    if argv[1:] == ["--check"]:
        left = leftovers()
        print("\n".join(left) or "no SPEC references left")
        return 1 if left else 0
    if argv[1:]:
        print(__doc__.split("Usage")[1].split("`tests")[0].strip(), file=sys.stderr)
        return 2
    for p in tracked_files():
        f = ROOT / p
        text = f.read_text(encoding="utf-8")
        new = rewrite(p, text)
        if new != text:
            f.write_text(new, encoding="utf-8")
            print(f"rewrote {p}")
    left = leftovers()
    if left:
        print("left for a person (no section number to map):\n" + "\n".join(left))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
