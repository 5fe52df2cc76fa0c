"""aicirt: sandboxed WebAssembly controllers that steer LLM decoding token by token.

The embedding surface (see docs/embedding.md): :class:`Runtime` loads controllers and runs their
`mid-process` calls on worker threads while the engine runs its forward pass. Importing aicirt
pulls in no model framework.
"""
from .abi import RowKind
from .core.batch import BatchHandle, BatchOutcome, RowsHandle, RowsOutcome
from .capabilities import Capabilities
from .loader.controller import Controller
from .errors import AicirtError, ControllerError, LoadError, MissingExtraError
from .limits import Limits
from .core.request import Request
from .core.results import Branch, Splice, StepInput, StepResult
from .core.runtime import Runtime
from .core.sequence import Sequence, SeqState
from .host.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer

__all__ = [
    "AicirtError", "BatchHandle", "BatchOutcome", "Branch", "ByteTokenizer", "Capabilities", "Controller",
    "ControllerError", "HFTokenizer", "Limits", "LoadError", "MissingExtraError", "Request", "RowKind", "RowsHandle", "RowsOutcome", "Runtime", "SeqState",
    "Sequence", "Splice", "StepInput", "StepResult", "Tokenizer",
]
