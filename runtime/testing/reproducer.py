"""Reproducer files: everything needed to run a fuzz failure again, as one JSON file.

The file holds the module itself (base64, so it replays even after the source changed: the
sha256 says which build failed), its argument, the limits and engine settings, and the plan
(the choice streams) of the shrunk run. :func:`replay` runs it and returns the RunResult;
`aicirt fuzz --replay FILE` does the same from the command line.
"""
from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..capabilities import Capabilities
from ..limits import Limits
from .choices import Plan
from .harness import EngineSettings

if TYPE_CHECKING:
    from ..host.tokenizer import Tokenizer
    from .fuzzer import Check, Fuzzer, FuzzFailure, RunResult

FORMAT = "aicirt-fuzz-reproducer/1"


def write_reproducer(directory: str | os.PathLike[str], fuzzer: "Fuzzer", failure: "FuzzFailure") -> Path:
    """Write `failure` under `directory` (created); returns the file's path."""
    # a Fuzzer without the module's bytes has its path
    module = (fuzzer.source if fuzzer.source is not None
              else Path(fuzzer.source_path).read_bytes())  # type: ignore[arg-type]
    data: dict[str, Any] = {
        "format": FORMAT,
        "controller": {"sha256": hashlib.sha256(module).hexdigest(), "source": fuzzer.source_path,
                       "module_base64": base64.b64encode(module).decode()},
        "arg_base64": base64.b64encode(fuzzer.arg).decode(),
        "capabilities": None if fuzzer.capabilities is None else int(fuzzer.capabilities),
        "prompt_tokens": list(fuzzer.prompt_tokens),
        "limits": dataclasses.asdict(fuzzer.limits),
        "settings": dataclasses.asdict(fuzzer.settings),
        "tokenizer": type(fuzzer.tokenizer).__name__,
        "max_steps": failure.step,
        "plan": failure.plan.to_json(),
        "failure": {"seed": failure.seed, "kind": failure.kind, "label": failure.label, "message": failure.message,
                    "calls": failure.calls, "trace": [list(map(_plain, ev)) for ev in failure.trace]},
    }
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"fuzz-{data['controller']['sha256'][:12]}-{failure.kind}-{failure.seed}.json"
    path.write_text(json.dumps(data, indent=1))
    return path


def _plain(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def load_reproducer(path: str | os.PathLike[str]) -> dict:
    """The file's content; raises ValueError if it is not a reproducer."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a reproducer file: {e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path}: not an {FORMAT} file")
    return data


def replay(path: str | os.PathLike[str], *, tokenizer: Tokenizer | None = None,
           check: Check | None = None) -> "RunResult":
    """Run a reproducer file again. `tokenizer`: needed unless the run used ByteTokenizer.
    Returns the RunResult: `.failure` is the failure again (or None if it no longer fails)."""
    from .fuzzer import Fuzzer

    data = load_reproducer(path)
    if tokenizer is None and data["tokenizer"] != "ByteTokenizer":
        raise ValueError(f"{path} was recorded with a {data['tokenizer']}: pass tokenizer=")
    module = base64.b64decode(data["controller"]["module_base64"])
    caps = data["capabilities"]
    with Fuzzer(module, base64.b64decode(data["arg_base64"]), tokenizer=tokenizer, check=check,
                capabilities=None if caps is None else Capabilities(caps), limits=Limits(**data["limits"]),
                prompt_tokens=tuple(data["prompt_tokens"]), settings=EngineSettings(**data["settings"])) as fz:
        return fz.run(plan=Plan.from_json(data["plan"]), max_steps=data["max_steps"] + 50)
