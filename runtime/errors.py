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
