"""How many examples a property test tries: a share of its full budget in the default run
(`make test`, AICIRT_FUZZ_SCALE=0.25), the whole of it under `make fuzz` (AICIRT_FUZZ_SCALE=1),
more for a deep run (e.g. AICIRT_FUZZ_SCALE=10 make fuzz)."""
from __future__ import annotations

import os

SCALE = float(os.environ.get("AICIRT_FUZZ_SCALE", "0.25"))


def examples(full: int) -> int:
    """`full` scaled by AICIRT_FUZZ_SCALE, at least 10."""
    return max(10, round(full * SCALE))
