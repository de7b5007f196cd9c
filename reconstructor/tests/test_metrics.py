"""The reconstructor's instruments: one reconstruction's statistics become counters; failures carry their type."""

from __future__ import annotations

from polar_core.errors import InvalidArgument
from polar_core.records import ReconstructionStats
from polar_core.testing import MetricPoints
from reconstructor.metrics import ReconstructorMetrics


def test_a_reconstruction_adds_its_statistics() -> None:
    m = MetricPoints()
    metrics = ReconstructorMetrics(m.provider)
    stats = ReconstructionStats(calls=7, aborted_calls=1, chains=3, merges=3, trainable_tokens=40, total_tokens=90)
    stats.count_split("prefix_mismatch")
    stats.count_split("prefix_mismatch")
    stats.count_split("policy_version")
    metrics.reconstructed("prefix-merge", stats, 0.25)
    metrics.reconstructed("exact", ReconstructionStats(calls=1, chains=1), 0.01)
    assert m.value("polar.reconstructor.reconstructions", strategy="prefix-merge", status="ok") == 1
    assert m.value("polar.reconstructor.traces", strategy="prefix-merge") == 3
    assert m.value("polar.reconstructor.traces") == 4
    assert m.value("polar.reconstructor.calls", outcome="used") == 7
    assert m.value("polar.reconstructor.calls", outcome="aborted") == 1
    assert m.value("polar.reconstructor.merges") == 3
    assert m.value("polar.reconstructor.splits", reason="prefix_mismatch") == 2
    assert m.value("polar.reconstructor.splits", reason="policy_version") == 1
    assert m.value("polar.reconstructor.tokens", type="trainable") == 40
    assert m.value("polar.reconstructor.tokens", type="total") == 90
    assert m.count("polar.reconstructor.reconstruction.duration", strategy="prefix-merge") == 1


def test_a_failure_is_counted_with_its_type() -> None:
    m = MetricPoints()
    ReconstructorMetrics(m.provider).failed("unspecified", InvalidArgument("no source"), 0.001)
    assert m.value("polar.reconstructor.reconstructions", status="error", **{"error.type": "InvalidArgument"}) == 1
    assert not m.points("polar.reconstructor.traces")
