"""Where aicirt keeps what it builds once: `$XDG_CACHE_HOME/aicirt/...` (default `~/.cache/aicirt`)."""
from __future__ import annotations

import os
from pathlib import Path


def user_cache_dir(*parts: str) -> Path:
    """`$XDG_CACHE_HOME/aicirt/<parts>`, or `~/.cache/aicirt/<parts>` when it is unset or empty."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, "aicirt", *parts)
