"""Where the grammar controller's slowest masks go: the controller built with -DGR_STATS (each mask
logs its work counters: lp root parts made, lpn nodes lex_walk visited, sl slices taken, runs,
unions, ...), run through aicirt.Runtime (object API) over the conformance grammars' strings as
bench/grammar_masks.py feeds them, and the slowest 2% of masks printed with their counters.

Usage: python bench/grammar_mask_stats.py [--vocab qwen2] [--top 2.0]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "grammars"))
sys.path.insert(0, str(ROOT / "tests"))

sys.path.insert(0, str(ROOT / "bench"))
from grammar_masks import baseline_wasm  # noqa: E402
from harness import VOCABS, Ours  # noqa: E402


def stats_wasm() -> bytes:
    """The grammar controller of this checkout's HEAD, its library built with GR_STATS defined."""
    def stats_on(tree: Path) -> None:
        h = tree / "lib" / "grammar" / "matcher_impl.h"
        h.write_text("#define GR_STATS 1\n" + h.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        return baseline_wasm("HEAD", Path(tmp), patch=stats_on)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", default="qwen2", choices=sorted(VOCABS))
    ap.add_argument("--top", type=float, default=2.0, help="percent of masks to print, slowest first")
    ap.add_argument("--grammars", default="", help="comma-separated grammar names (default: all)")
    a = ap.parse_args()
    v = VOCABS[a.vocab]()
    ours = Ours(v, wasm=stats_wasm())
    recs: list[tuple[float, str, int, str, bytes]] = []
    grammar = [""]
    submit = ours._submit

    def recorded(seq, toks, sampled, record=True, errors_ok=False):
        r, mask = submit(seq, toks, sampled, record, errors_ok)
        if record and r.branches:
            st = [line for line in "".join(r.logs).splitlines() if line.startswith("ST ")]
            text = b"".join(v.token_bytes[t] for t in toks)
            walks = [line[5:] for line in "".join(r.logs).splitlines() if line.startswith("WALK ")]
            recs.append((r.elapsed_us, grammar[0], len(toks), (st[-1] if st else "") + "".join(
                f"\n    walk {w}" for w in walks), text))
        return r, mask
    ours._submit = recorded
    try:
        only = set(filter(None, a.grammars.split(",")))
        for p in sorted((ROOT / "tests" / "grammars").glob("*.lark")):
            if only and p.stem not in only:
                continue
            h, err, _ = ours.open(p.read_text(encoding="utf-8"))
            if err:
                continue
            grammar[0] = p.stem
            cases = json.loads(p.with_suffix(".json").read_text(encoding="utf-8"))
            for text in cases["valid"] + cases["invalid"]:
                ours.masks(h, v.tokenize(text.encode("utf-8")))
            ours.close_handle(h)
    finally:
        ours.close()
    recs.sort(reverse=True)
    times = sorted(r[0] for r in recs)
    print(f"{a.vocab}: {len(recs)} masks, inside p50 {times[len(times) // 2]:.0f} us, "
          f"p99 {times[int(len(times) * 0.99)]:.0f} us; slowest {a.top}% (us, grammar, tokens fed, counters, text fed):")
    for r in recs[:max(1, int(len(recs) * a.top / 100))]:
        print(f"{r[0]:.0f} {r[1]} {r[2]} {r[3]} {r[4]!r}")


if __name__ == "__main__":
    main()
