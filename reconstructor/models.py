"""The reconstructor's records: the options a reconstruction takes, what it knows of a session, its result,
and the service's defaults for what a request leaves unspecified (built by ``app.py`` from the settings)."""

from __future__ import annotations

import dataclasses

from polar_core.records import ReconstructionStats, ReconstructionStrategy, TerminalStatus, Trace
from reconstructor.trace_weights import WeightingMode

__all__ = ["ReconstructionOptions", "ReconstructionResult", "ServiceDefaults", "SessionOutcome"]


@dataclasses.dataclass(frozen=True, slots=True)
class ReconstructionOptions:
    """How completions become traces.

    Attributes:
        strategy: ``per-request``, ``prefix-merge`` or ``exact``.
        end_of_turn_ids: Token IDs that close an assistant turn. Empty means: detect them from the session's
            completions (only ``prefix-merge`` needs them).
        weighting: How trace weights are normalised.
        split_on_policy_version: Keep calls sampled by different policy versions in different traces (on by
            default: a trace never mixes weights; ``False`` opts out).
        prefer_exact_context: (``prefix-merge``) when several chains qualify, prefer one whose merge keeps
            the call's context exact before comparing prefix lengths. Off by default: Polar's order is
            parent, longest prefix, most recent.
    """

    strategy: ReconstructionStrategy = ReconstructionStrategy.PREFIX_MERGE
    end_of_turn_ids: tuple[int, ...] = ()
    weighting: WeightingMode = WeightingMode.SESSION
    split_on_policy_version: bool = True
    prefer_exact_context: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class SessionOutcome:
    """What the rest of the system knows about a session: its group, reward and terminal status."""

    task_id: str = ""
    reward: float = 0.0
    status: TerminalStatus = TerminalStatus.UNRESOLVED


@dataclasses.dataclass(slots=True)
class ReconstructionResult:
    """Traces (in session order, then ``trace_index`` order) and their statistics."""

    traces: list[Trace]
    stats: ReconstructionStats


@dataclasses.dataclass(frozen=True, slots=True)
class ServiceDefaults:
    """What the service uses where a ``ReconstructRequest`` leaves a field unspecified.

    Attributes:
        strategy: Strategy for ``RECONSTRUCTION_STRATEGY_UNSPECIFIED``.
        end_of_turn_ids: End-of-turn IDs when the request gives none (empty: detect them).
        weighting: Weighting for ``WEIGHTING_MODE_UNSPECIFIED``.
        split_on_policy_version: Keep calls sampled by different policy versions in different traces (on by
            default: a trace never mixes weights; ``False`` opts out).
        prefer_exact_context: (prefix-merge) prefer context-exact merges when several chains qualify.
    """

    strategy: ReconstructionStrategy = ReconstructionStrategy.PREFIX_MERGE
    end_of_turn_ids: tuple[int, ...] = ()
    weighting: WeightingMode = WeightingMode.SESSION
    split_on_policy_version: bool = True
    prefer_exact_context: bool = False
