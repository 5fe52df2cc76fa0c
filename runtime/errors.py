"""Exceptions. Errors of one sequence never raise: they end that sequence (StepResult.error)."""


class AicirtError(Exception):
    """Base class of aicirt's exceptions."""


class LoadError(AicirtError):
    """The module is not a valid controller: names what is missing or mistyped."""


class ControllerError(AicirtError):
    """A controller misbehaved; raised only where no step result can carry it (e.g. spawn)."""


class MissingExtraError(AicirtError, ImportError):
    """An optional dependency is not installed. The message is one line naming the `pip install`
    to run; `install` holds that command."""

    def __init__(self, what: str, install: str, cause: str | None = None):
        self.install = install
        super().__init__(f"{what} ({cause}): {install}" if cause else f"{what}: {install}")


def failure_message(error: str, log: str | bytes = b"") -> str:
    """What a user is told when a controller ended its sequence with `error` (a trap, a stop on
    its first call, an invalid result): the controller's own reason first -- the last non-empty
    line of its log, when it logged one -- then the Wasm detail. Every route that reports a
    controller's failure (CLI, server, vLLM) words it with this function."""
    text = log.decode("utf-8", "replace") if isinstance(log, bytes) else log
    reason = next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")
    if not reason or reason in error:
        return error
    return f"{reason} ({error})" if error else reason
