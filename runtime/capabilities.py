"""The WIT `capability-set` flags (bit order as declared: fork, backtrack, ff-tokens, conditional)."""
from enum import IntFlag


class Capabilities(IntFlag):
    NONE = 0
    FORK = 1
    BACKTRACK = 2
    FF_TOKENS = 4
    CONDITIONAL_FF_TOKENS = 8
    ALL = 15
