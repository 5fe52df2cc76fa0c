"""Checking a controller's argument before a model loads: its first call, on a byte tokenizer.

A controller that rejects its argument (a regex that does not parse, a JSON Schema keyword it
cannot enforce) stops on its first call and logs why. `aicirt run` runs that call here, in
milliseconds, so that the reason is reported before the model loads, not after.
"""
from __future__ import annotations

from pathlib import Path

PROMPT = b"Q: "


def preflight(wasm: Path | bytes, arg: bytes) -> None:
    """Run the first call of `wasm` with `arg` over aicirt.ByteTokenizer. Raises ValueError with
    the controller's log when it stops there (no branches) having logged something; any other
    outcome (a mask, a fork, an error of the run itself) is left to the real run."""
    from .runtime import Runtime
    from .tokenizer import ByteTokenizer

    rt = Runtime(ByteTokenizer(), workers=1, cache_dir=False)
    try:
        ctrl = rt.load(Path(wasm).read_bytes() if isinstance(wasm, (str, Path)) else wasm)
        req = rt.new_request(ctrl, arg=arg)
        seq = req.spawn()
        try:
            r = rt.submit([(seq, list(PROMPT), None)]).wait().results[0]
        finally:
            seq.close()
            req.close()
    finally:
        rt.close()
    logs = "".join(r.logs).strip()
    if r.status == "ok" and not r.branches and logs:
        raise ValueError(f"the controller rejected its argument: {logs}")
