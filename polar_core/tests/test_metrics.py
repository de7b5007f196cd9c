"""The shared metrics helper: Prometheus names of declared instruments, the endpoint's start and stop."""

from __future__ import annotations

import hashlib
import urllib.error
import urllib.request

import pytest
from opentelemetry.metrics import NoOpMeterProvider

from polar_core.errors import InvalidArgument
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


def _scrape(port: int, authorization: str | None) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if authorization is not None:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


@pytest.mark.parametrize("setting", ["scrape-Secret-9", "sha256:" + hashlib.sha256(b"scrape-Secret-9").hexdigest()])
def test_a_metrics_token_refuses_a_scrape_without_it(setting: str) -> None:
    endpoint, provider = open_endpoint("polar-test", "127.0.0.1", 0, token=setting)
    assert endpoint is not None
    try:
        spec = MetricSpec("polar.test.events", InstrumentKind.COUNTER, "{event}", "Events.", ("kind",))
        make_instrument(provider.get_meter("t"), spec).add(1, {"kind": "a"})
        for header in (None, "Bearer wrong", "Basic c2NyYXBlLVNlY3JldC05", "Bearer ", "scrape-Secret-9"):
            status, body = _scrape(endpoint.port, header)
            assert status == 401, header
            assert "polar_test_events" not in body
            assert "Authorization: Bearer" in body
        status, body = _scrape(endpoint.port, "Bearer scrape-Secret-9")
        assert status == 200
        assert 'polar_test_events_total{kind="a"' in body
        assert _scrape(endpoint.port, "bearer scrape-Secret-9")[0] == 200  # the scheme is case-insensitive
    finally:
        endpoint.stop()


def test_a_malformed_token_digest_is_refused_at_start() -> None:
    with pytest.raises(InvalidArgument, match="metrics_token"):
        open_endpoint("polar-test", "127.0.0.1", 0, token="sha256:abc")


def test_an_open_endpoint_off_loopback_warns(caplog: pytest.LogCaptureFixture) -> None:
    endpoint = MetricsEndpoint(service_name="polar-test")
    try:
        endpoint.start("0.0.0.0", 0)
        assert _scrape(endpoint.port, None)[0] == 200
    finally:
        endpoint.stop()
    assert "need no token" in caplog.text
