"""The shared metrics helper: Prometheus names of declared instruments, the endpoint's start and stop."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from opentelemetry.metrics import NoOpMeterProvider

from polar_core.metrics import InstrumentKind, MetricsEndpoint, MetricSpec, make_instrument, open_endpoint
from polar_core.metrics import prometheus_series as series


@pytest.mark.parametrize(
    ("spec", "name", "kind"),
    [
        (MetricSpec("polar.proxy.calls", InstrumentKind.COUNTER, "{call}", ""), "polar_proxy_calls_total", "counter"),
        (
            MetricSpec("gen_ai.server.time_to_first_token", InstrumentKind.HISTOGRAM, "s", ""),
            "gen_ai_server_time_to_first_token_seconds",
            "histogram",
        ),
        (MetricSpec("polar.x.size", InstrumentKind.GAUGE, "By", ""), "polar_x_size_bytes", "gauge"),
        (MetricSpec("polar.x.wait_seconds", InstrumentKind.HISTOGRAM, "s", ""), "polar_x_wait_seconds", "histogram"),
        (MetricSpec("polar.x.open", InstrumentKind.UP_DOWN_COUNTER, "1", ""), "polar_x_open", "gauge"),
    ],
)
def test_prometheus_names_follow_the_exporter(spec: MetricSpec, name: str, kind: str) -> None:
    assert (spec.prometheus_name, spec.prometheus_type) == (name, kind)


def test_series_of_a_histogram_include_bucket_sum_and_count() -> None:
    spec = MetricSpec("polar.x.lag", InstrumentKind.HISTOGRAM, "{version}", "", ("gen_ai.token.type",))
    assert series([spec]) == {"polar_x_lag", "polar_x_lag_bucket", "polar_x_lag_sum", "polar_x_lag_count"}
    assert spec.prometheus_labels == ("gen_ai_token_type",)


def test_an_observable_gauge_needs_its_callback() -> None:
    spec = MetricSpec("polar.x.g", InstrumentKind.OBSERVABLE_GAUGE, "1", "")
    with pytest.raises(ValueError, match="needs a callback"):
        make_instrument(NoOpMeterProvider().get_meter("t"), spec)


def test_port_minus_one_serves_nothing_and_meters_on_a_no_op_provider() -> None:
    endpoint, provider = open_endpoint("polar-test", "127.0.0.1", -1)
    assert endpoint is None
    assert isinstance(provider, NoOpMeterProvider)


def test_the_endpoint_serves_its_own_registry_until_stopped() -> None:
    endpoint, provider = open_endpoint("polar-test", "127.0.0.1", 0)
    other = MetricsEndpoint(service_name="polar-other")
    assert endpoint is not None
    try:
        spec = MetricSpec("polar.test.events", InstrumentKind.COUNTER, "{event}", "Events.", ("kind",))
        make_instrument(provider.get_meter("t"), spec).add(2, {"kind": "a"})
        make_instrument(other.meter_provider.get_meter("t"), spec).add(5, {"kind": "b"})
        text = urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}/metrics", timeout=10).read().decode()
        assert 'polar_test_events_total{kind="a"' in text
        assert 'kind="b"' not in text  # another endpoint's instruments stay out
        assert 'service_name="polar-test"' in text
    finally:
        endpoint.stop()
        endpoint.stop()
        other.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}/metrics", timeout=2)
