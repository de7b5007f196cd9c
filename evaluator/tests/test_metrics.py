"""The evaluator's instruments: evaluations by status, the active gauge, prepares and prewarm hits."""

from __future__ import annotations

from evaluator.metrics import EvaluatorMetrics
from polar_core.testing import MetricPoints


def test_evaluations_prepares_and_prewarm_are_counted() -> None:
    m = MetricPoints()
    metrics = EvaluatorMetrics(m.provider)
    metrics.evaluation_started()
    metrics.evaluation_started()
    assert m.value("polar.evaluator.evaluations.active") == 2
    metrics.evaluation_finished("swe", "resolved", 12.0)
    metrics.evaluation_finished("swe", "error", 1.0)
    assert m.value("polar.evaluator.evaluations.active") == 0
    assert m.value("polar.evaluator.evaluations", strategy="swe", status="resolved") == 1
    assert m.value("polar.evaluator.evaluation.duration", status="resolved") == 12.0
    metrics.prepared("prepared", 3.0)
    metrics.prepared("reused", 0.0)
    metrics.prewarm(hit=False)
    metrics.prewarm(hit=True)
    metrics.prewarm(hit=True)
    assert m.value("polar.evaluator.prepares", outcome="reused") == 1
    assert m.count("polar.evaluator.prepare.duration", outcome="prepared") == 1
    assert m.value("polar.evaluator.prewarm", result="hit") == 2
    assert m.value("polar.evaluator.prewarm", result="miss") == 1
