"""The reconstructor's instruments: reconstructions by status, traces, calls, merges, splits by reason, tokens.

Recorded once per reconstruction from its :class:`~polar_core.records.ReconstructionStats` (the servicer calls
:meth:`ReconstructorMetrics.reconstructed`); :data:`RECONSTRUCTOR_METRICS` declares them all.
"""

from __future__ import annotations

from opentelemetry.metrics import MeterProvider, NoOpMeterProvider

from polar_core.metrics import InstrumentKind, MetricSpec, make_instrument
from polar_core.records import ReconstructionStats

__all__ = ["RECONSTRUCTOR_METRICS", "ReconstructorMetrics"]

_C, _H = InstrumentKind.COUNTER, InstrumentKind.HISTOGRAM

_RUNS = MetricSpec(
    "polar.reconstructor.reconstructions",
    _C,
    "{reconstruction}",
    "Reconstruct and ReconstructStream calls, by strategy and status (ok, error; error.type on errors).",
    ("strategy", "status", "error.type"),
)
_DURATION = MetricSpec(
    "polar.reconstructor.reconstruction.duration",
    _H,
    "s",
    "Seconds to reconstruct one session (reading a proxy's completions included).",
    ("strategy", "status"),
)
_TRACES = MetricSpec("polar.reconstructor.traces", _C, "{trace}", "Traces produced.", ("strategy",))
_CALLS = MetricSpec(
    "polar.reconstructor.calls", _C, "{call}", "Completion records read, by outcome: used or aborted.", ("outcome",)
)
_MERGES = MetricSpec("polar.reconstructor.merges", _C, "{merge}", "Calls merged into an existing chain.", ("strategy",))
_SPLITS = MetricSpec(
    "polar.reconstructor.splits",
    _C,
    "{split}",
    "Calls that started a new chain although one existed, by reason (prefix_mismatch, policy_version, ...).",
    ("reason",),
)
_TOKENS = MetricSpec(
    "polar.reconstructor.tokens",
    _C,
    "{token}",
    "Tokens of the traces produced: type trainable (loss mask 1) or total (prompt and response).",
    ("type",),
)
_MISMATCHED = MetricSpec(
    "polar.reconstructor.mismatched_context.calls",
    _C,
    "{call}",
    "Merged calls whose merged context differs from the prompt they were sampled with.",
)

RECONSTRUCTOR_METRICS = (_RUNS, _DURATION, _TRACES, _CALLS, _MERGES, _SPLITS, _TOKENS, _MISMATCHED)
"""Every instrument of the reconstructor."""


class ReconstructorMetrics:
    """Records reconstructions on OpenTelemetry instruments."""

    def __init__(self, meter_provider: MeterProvider | None = None) -> None:
        meter = (meter_provider or NoOpMeterProvider()).get_meter("polar.reconstructor")
        self._runs = make_instrument(meter, _RUNS)
        self._duration = make_instrument(meter, _DURATION)
        self._traces = make_instrument(meter, _TRACES)
        self._calls = make_instrument(meter, _CALLS)
        self._merges = make_instrument(meter, _MERGES)
        self._splits = make_instrument(meter, _SPLITS)
        self._tokens = make_instrument(meter, _TOKENS)
        self._mismatched = make_instrument(meter, _MISMATCHED)

    def reconstructed(self, strategy: str, stats: ReconstructionStats, duration_s: float) -> None:
        """A session was reconstructed with ``strategy`` in ``duration_s`` and gave ``stats``."""
        by_strategy = {"strategy": strategy}
        self._runs.add(1, {"strategy": strategy, "status": "ok"})
        self._duration.record(duration_s, {"strategy": strategy, "status": "ok"})
        self._traces.add(stats.chains, by_strategy)
        self._calls.add(stats.calls - stats.aborted_calls, {"outcome": "used"})
        self._calls.add(stats.aborted_calls, {"outcome": "aborted"})
        self._merges.add(stats.merges, by_strategy)
        for reason, n in stats.splits_by_reason.items():
            self._splits.add(n, {"reason": reason})
        self._tokens.add(stats.trainable_tokens, {"type": "trainable"})
        self._tokens.add(stats.total_tokens, {"type": "total"})
        self._mismatched.add(stats.mismatched_context_calls)

    def failed(self, strategy: str, exc: BaseException, duration_s: float) -> None:
        """A reconstruction failed with ``exc`` after ``duration_s``."""
        self._runs.add(1, {"strategy": strategy, "status": "error", "error.type": type(exc).__name__})
        self._duration.record(duration_s, {"strategy": strategy, "status": "error"})
