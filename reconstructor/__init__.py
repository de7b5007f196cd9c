"""The reconstructor: turns a session's completion records into token-faithful training traces.

See ``docs/reconstruction.md`` for the strategies and the guarantees each one gives.
"""

from __future__ import annotations

from polar_core.records import ReconstructionStats, SplitReason
from reconstructor.core import (
    ReconstructionOptions,
    ReconstructionResult,
    SessionOutcome,
    build_chains,
    reconstruct,
    reconstruct_session,
)
from reconstructor.eot import detect_end_of_turn_ids, end_of_turn_ids_from_tokenizer
from reconstructor.errors import EndOfTurnUnknown, MalformedCompletions
from reconstructor.weights import WeightingMode, trace_weights

__all__ = [
    "EndOfTurnUnknown",
    "MalformedCompletions",
    "ReconstructionOptions",
    "ReconstructionResult",
    "ReconstructionStats",
    "SessionOutcome",
    "SplitReason",
    "WeightingMode",
    "build_chains",
    "detect_end_of_turn_ids",
    "end_of_turn_ids_from_tokenizer",
    "reconstruct",
    "reconstruct_session",
    "trace_weights",
]
