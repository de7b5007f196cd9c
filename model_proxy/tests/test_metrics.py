"""The proxy's instruments: one finished call's latencies and tokens, failures, gauges read at collection."""

from __future__ import annotations

from opentelemetry.metrics import NoOpMeterProvider

from model_proxy.errors import BackendTimeout, TooManyCalls
from model_proxy.metrics import CallMeasurement, GateView, ProxyMetrics
from polar_core.testing import MetricPoints

_CALL = CallMeasurement("anthropic_messages", "ok", 2.0, 0.5, 100, 11, 1.8, 1.5, 0.002, "vllm")


def test_a_finished_call_records_its_latencies_and_tokens() -> None:
    m = MetricPoints()
    metrics = ProxyMetrics(m.provider)
    metrics.call_finished(_CALL)
    assert m.value("polar.proxy.calls", protocol="anthropic_messages", status="ok") == 1
    assert m.value("gen_ai.server.request.duration", status="ok") == 2.0
    assert m.value("gen_ai.server.time_to_first_token", protocol="anthropic_messages") == 0.5
    assert m.value("gen_ai.client.token.usage", **{"gen_ai.token.type": "input"}) == 100
    assert m.value("gen_ai.client.token.usage", **{"gen_ai.token.type": "output"}) == 11
    assert m.value("gen_ai.server.time_per_output_token") == 1.5 / 10  # decode time over the tokens after the first
    assert m.value("gen_ai.client.operation.duration", backend="vllm") == 1.8
    assert m.value("polar.proxy.record.write.duration") == 0.002


def test_a_call_of_one_token_has_no_per_token_time_and_an_unwritten_record_no_write_time() -> None:
    m = MetricPoints()
    ProxyMetrics(m.provider).call_finished(
        CallMeasurement("openai_chat", "aborted", 1.0, 0.5, 10, 1, 0.9, 0.0, None, "scripted")
    )
    assert m.value("polar.proxy.calls", status="aborted") == 1
    assert not m.points("gen_ai.server.time_per_output_token")
    assert not m.points("polar.proxy.record.write.duration")


def test_failures_carry_their_error_type() -> None:
    m = MetricPoints()
    metrics = ProxyMetrics(m.provider)
    metrics.call_failed("openai_chat", TooManyCalls("busy", retry_after_s=1.0))
    metrics.call_failed("openai_chat", BackendTimeout("slow"), duration_s=3.0)
    metrics.backend_error("vllm", BackendTimeout("slow"))
    assert m.value("polar.proxy.calls", status="error", **{"error.type": "TooManyCalls"}) == 1
    assert m.value("polar.proxy.calls", status="error", **{"error.type": "BackendTimeout"}) == 1
    assert m.count("gen_ai.server.request.duration", status="error") == 1  # only the one that reached the engine
    assert m.value("polar.proxy.backend.errors", backend="vllm", **{"error.type": "BackendTimeout"}) == 1


def test_gauges_read_the_gate_at_collection() -> None:
    m = MetricPoints()
    paused, version = [True], ["12"]
    view = GateView(
        in_flight=lambda: 3, paused_calls=lambda: 2, paused=lambda: paused[0], policy_version=lambda: version[0]
    )
    ProxyMetrics(m.provider, view)
    assert m.value("polar.proxy.calls.in_flight") == 3
    assert m.value("polar.proxy.calls.paused") == 2
    assert m.value("polar.proxy.generation.paused") == 1
    assert m.value("polar.proxy.policy.version") == 12
    paused[0], version[0] = False, "base"  # a configured label is the initial version, 0
    assert m.value("polar.proxy.generation.paused") == 0
    assert m.value("polar.proxy.policy.version") == 0


def test_metrics_off_is_a_no_op_the_engine_can_skip() -> None:
    assert not ProxyMetrics(NoOpMeterProvider()).enabled
    assert ProxyMetrics(MetricPoints().provider).enabled
