"""The generation engine over the runtime: requests, scheduling, sampling, model backends.

    from aicirt.engine import Engine, SamplingParams
    from aicirt.engine.backends import load_backend

Sits above the runtime core (`aicirt.Runtime` and below), which never imports from here.
"""
from .engine import Engine
from .sampling import SamplingParams
from .scheduler import Scheduler
from .types import EngineStats, Event, FinishEvent, ForkEvent, GenRequest, GenSeq, LogEvent, TokensEvent, VarEvent

__all__ = ["Engine", "EngineStats", "Event", "FinishEvent", "ForkEvent", "GenRequest", "GenSeq",
           "LogEvent", "SamplingParams", "Scheduler", "TokensEvent", "VarEvent"]
