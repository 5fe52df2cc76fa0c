"""What every build reads and how it fails: the package data (the SDK, the shipped controllers,
the WIT), the compiler's flags and version, and :class:`BuildError`. The base of `aicirt.build`:
`toolchain` (building a controller) and `recipe` (a `build.json`) both import it, never each
other's internals."""
from __future__ import annotations

import functools
import importlib.metadata
from pathlib import Path

#: What a build reads besides the user's sources, as package data: `aicirt/_data/` holds the SDK
#: and shipped controllers (`controllers/`) and the contract (`wit/`). In a checkout (and so in an
#: editable install) those two are symlinks to the repo's own folders; a wheel carries copies. So
#: the lookup is the same everywhere and never depends on the current folder.
DATA_DIR = Path(__file__).resolve().parent.parent / "_data"
CONTROLLERS_DIR = DATA_DIR / "controllers"
SDK_DIR = CONTROLLERS_DIR / "sdk"
#: Folders of `controllers/` that are not controllers: the SDK and the shared libraries.
NOT_CONTROLLERS = {"sdk", "lib"}
WIT_DIR = DATA_DIR / "wit"
STACK_SIZE = 256 * 1024          # shadow stack in linear memory; the SDK keeps big data on the heap

# -flto: the controller, its libraries and the SDK optimized as one program, so that the SDK's small
# calls (a DFA row, a token's bytes) inline into a controller's walks (the json controller's masks
# faster, its modules larger: docs/writing-controllers.md)
C_FLAGS = ["-O2", "-flto", "-mbulk-memory", "-msimd128", "-g0", "-Wall", "-Wno-unused-parameter"]
LINK_FLAGS = ["-Wl,--no-entry", "-Wl,--strip-all", f"-Wl,-z,stack-size={STACK_SIZE}"]


class BuildError(Exception):
    """A failed build; the message carries the compiler's own diagnostics (file:line: ...)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def sdk_sources() -> list[Path]:
    return sorted(SDK_DIR.glob("*.c"))


@functools.lru_cache(maxsize=1)
def compiler_version() -> str:
    try:
        return importlib.metadata.version("ziglang")
    except importlib.metadata.PackageNotFoundError:
        return "none"
