"""`aicirt fuzz`: the fuzzer from the command line, with a progress bar and a summary.

Exit status 0 when every run kept the contract, 1 on a failure (its shrunk trace is printed and
a reproducer file written), 2 for bad usage (click's).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import IO

from ..capabilities import Capabilities

_CAPS = {"fork": Capabilities.FORK, "backtrack": Capabilities.BACKTRACK, "ff-tokens": Capabilities.FF_TOKENS,
         "conditional-ff-tokens": Capabilities.CONDITIONAL_FF_TOKENS}


def parse_capabilities(text: str | None) -> Capabilities | None:
    """None/"random" -> random per run; "all", "none" or a comma list of WIT flag names."""
    if text is None or text == "random":
        return None
    if text == "all":
        return Capabilities.ALL
    caps = Capabilities.NONE
    for name in filter(None, (p.strip() for p in text.split(","))):
        if name == "none":
            continue
        if name not in _CAPS:
            raise ValueError(f"unknown capability {name!r} (one of: random, all, none, {', '.join(_CAPS)})")
        caps |= _CAPS[name]
    return caps


def fuzz_command(controller: str, *, steps: int, seed: int, time_s: float | None, arg: bytes,
                 capabilities: str | None, max_tokens: int, out_dir: str, shrink: bool,
                 stream: IO[str] = sys.stderr) -> int:
    """Fuzz `controller` (a .wasm, a C/Zig source or a shipped name); returns the exit status."""
    from tqdm import tqdm

    from ..runner.run import resolve_controller
    from .fuzzer import Fuzzer

    caps = parse_capabilities(capabilities)
    path = resolve_controller(controller)
    with Fuzzer(path, arg, capabilities=caps, max_tokens=max_tokens) as fz:
        bar = tqdm(total=steps, unit="step", file=stream, disable=None, dynamic_ncols=True,
                   desc=f"fuzz {Path(path).name}")
        try:
            report = fz.fuzz(steps, seed, time_s, shrink=shrink, reproducer_dir=out_dir, progress=bar.update)
        finally:
            bar.close()
    print(report)
    return 0 if report.ok else 1


def replay_command(path: str) -> int:
    """Replay a reproducer file; exit 1 if it still fails, 0 if it no longer does."""
    from .reproducer import replay

    res = replay(path)
    if res.failure is None:
        print(f"{path}: no longer fails ({res.steps} steps, finish reasons {dict(res.finish_reasons)})")
        return 0
    print(f"{path}: fails again\n{res.failure}")
    return 1
