"""The evaluator's instruments: evaluations by status and their duration, prepares, the pytest prewarm.

A *prewarm hit* is a Prepare of a local evaluation that found the one-time pytest warm-up
(``evaluator.core._warm_pytest``) already done; a miss ran it or waited for it. :data:`EVALUATOR_METRICS`
declares every instrument.
"""

from __future__ import annotations

from opentelemetry.metrics import MeterProvider, NoOpMeterProvider

from polar_core.metrics import InstrumentKind, MetricSpec, make_instrument

__all__ = ["EVALUATOR_METRICS", "EvaluatorMetrics"]

_C, _H, _U = InstrumentKind.COUNTER, InstrumentKind.HISTOGRAM, InstrumentKind.UP_DOWN_COUNTER

_EVALUATIONS = MetricSpec(
    "polar.evaluator.evaluations",
    _C,
    "{evaluation}",
    "Evaluations that ran, by strategy and terminal status (resolved, unresolved, eval_timeout, ...).",
    ("strategy", "status"),
)
_DURATION = MetricSpec(
    "polar.evaluator.evaluation.duration",
    _H,
    "s",
    "Seconds an evaluation ran (scoring, runtime teardown included).",
    ("strategy", "status"),
)
_ACTIVE = MetricSpec("polar.evaluator.evaluations.active", _U, "{evaluation}", "Evaluations running now.")
_PREPARES = MetricSpec(
    "polar.evaluator.prepares",
    _C,
    "{prepare}",
    "Prepare calls, by outcome: prepared, reused (the handle was prepared already) or failed.",
    ("outcome",),
)
_PREPARE_DURATION = MetricSpec(
    "polar.evaluator.prepare.duration", _H, "s", "Seconds a Prepare took (runtime start and task setup).", ("outcome",)
)
_PREWARM = MetricSpec(
    "polar.evaluator.prewarm",
    _C,
    "{prepare}",
    "Local prepares that found the pytest warm-up done (result hit) or ran or awaited it (miss).",
    ("result",),
)

EVALUATOR_METRICS = (_EVALUATIONS, _DURATION, _ACTIVE, _PREPARES, _PREPARE_DURATION, _PREWARM)
"""Every instrument of the evaluator."""


class EvaluatorMetrics:
    """Records evaluations and prepares on OpenTelemetry instruments (the evaluation service calls it)."""

    def __init__(self, meter_provider: MeterProvider | None = None) -> None:
        meter = (meter_provider or NoOpMeterProvider()).get_meter("polar.evaluator")
        self._evaluations = make_instrument(meter, _EVALUATIONS)
        self._duration = make_instrument(meter, _DURATION)
        self._active = make_instrument(meter, _ACTIVE)
        self._prepares = make_instrument(meter, _PREPARES)
        self._prepare_duration = make_instrument(meter, _PREPARE_DURATION)
        self._prewarm = make_instrument(meter, _PREWARM)

    def evaluation_started(self) -> None:
        """An evaluation began running."""
        self._active.add(1)

    def evaluation_finished(self, strategy: str, status: str, duration_s: float) -> None:
        """An evaluation ended with ``status`` after ``duration_s`` (or failed: ``status`` ``error``)."""
        self._active.add(-1)
        attributes = {"strategy": strategy, "status": status}
        self._evaluations.add(1, attributes)
        self._duration.record(duration_s, attributes)

    def prepared(self, outcome: str, duration_s: float) -> None:
        """A Prepare ended in ``outcome`` (prepared, reused, failed) after ``duration_s``."""
        self._prepares.add(1, {"outcome": outcome})
        self._prepare_duration.record(duration_s, {"outcome": outcome})

    def prewarm(self, hit: bool) -> None:
        """A local prepare found the pytest warm-up done (``hit``) or not."""
        self._prewarm.add(1, {"result": "hit" if hit else "miss"})
