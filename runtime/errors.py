"""Exceptions. Errors of one sequence never raise: they end that sequence (StepResult.error)."""


class AicirtError(Exception):
    """Base class of aicirt's exceptions."""


class LoadError(AicirtError):
    """The module is not a valid controller: names what is missing or mistyped."""


class ControllerError(AicirtError):
    """A controller misbehaved; raised only where no step result can carry it (e.g. spawn)."""
