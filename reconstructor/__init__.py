"""The reconstructor: turns a session's completion records into token-faithful training traces.

See ``docs/reconstruction.md`` for the strategies and the guarantees each one gives. The domain entry is
:mod:`reconstructor.core` (:func:`reconstruct`, :func:`reconstruct_session`; no gRPC); its records are in
:mod:`reconstructor.models`; :mod:`reconstructor.servicer` serves it over gRPC, converting with
:mod:`reconstructor.convert`; :class:`reconstructor.app.ReconstructorApp` builds what the servicer needs from
the settings, and :func:`reconstructor.server.start_server` starts the service. The app, the settings and the
server are not imported here, so importing the package for offline reconstruction loads no gRPC.
"""

from __future__ import annotations

from polar_core.records import ReconstructionStats, SplitReason
from reconstructor.core import build_chains, reconstruct, reconstruct_session
from reconstructor.eot import detect_end_of_turn_ids, end_of_turn_ids_from_tokenizer
from reconstructor.errors import EndOfTurnUnknown, MalformedCompletions
from reconstructor.models import ReconstructionOptions, ReconstructionResult, ServiceDefaults, SessionOutcome
from reconstructor.ports import CompletionSource
from reconstructor.trace_weights import WeightingMode, trace_weights

__all__ = [
    "CompletionSource",
    "EndOfTurnUnknown",
    "MalformedCompletions",
    "ReconstructionOptions",
    "ReconstructionResult",
    "ReconstructionStats",
    "ServiceDefaults",
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
