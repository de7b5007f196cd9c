"""OpenTelemetry metrics of the session pipeline, and the Prometheus endpoint that serves them.

Per stage (label ``stage``): ``polar_gateway_stage_queue_length`` and ``polar_gateway_stage_occupancy``
(gauges), ``polar_gateway_stage_entered_total`` and ``polar_gateway_stage_exited_total`` (counters),
``polar_gateway_stage_residence_seconds`` (histogram of time a slot was held) and
``polar_gateway_stage_wait_seconds`` (histogram of time spent queued). Finished sessions are counted by status
in ``polar_gateway_sessions_finished_total``. From outside, Little's law ``L = λW`` for a stage reads: time-averaged
occupancy = rate of ``exited_total`` × (residence ``_sum`` / ``_count``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from wsgiref.simple_server import WSGIServer

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, start_http_server

from gateway.models import Stage
from gateway.pools import StageSnapshot
from polar_core.records import TerminalStatus

__all__ = ["GatewayMetrics", "MetricsEndpoint"]

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


class GatewayMetrics:
    """Records pipeline events as OpenTelemetry instruments (it is the pools' observer)."""

    def __init__(self, meter_provider: MeterProvider) -> None:
        meter = meter_provider.get_meter("polar.gateway")
        self._snapshots: Callable[[], Sequence[StageSnapshot]] = list
        meter.create_observable_gauge(
            "polar_gateway_stage_queue_length",
            callbacks=[self._observe_queue],
            description="Sessions waiting to enter the stage.",
        )
        meter.create_observable_gauge(
            "polar_gateway_stage_occupancy",
            callbacks=[self._observe_occupancy],
            description="Sessions the stage is serving (slots held).",
        )
        meter.create_observable_gauge(
            "polar_gateway_stage_workers", callbacks=[self._observe_workers], description="Slots of the stage."
        )
        self._entered = meter.create_counter(
            "polar_gateway_stage_entered", description="Sessions that entered the stage."
        )
        self._exited = meter.create_counter("polar_gateway_stage_exited", description="Sessions that left the stage.")
        self._residence = meter.create_histogram(
            "polar_gateway_stage_residence", unit="s", description="Seconds a session held the stage's slot."
        )
        self._wait = meter.create_histogram(
            "polar_gateway_stage_wait", unit="s", description="Seconds a session waited for the stage's slot."
        )
        self._finished = meter.create_counter(
            "polar_gateway_sessions_finished", description="Sessions that reached a terminal status."
        )

    def bind(self, snapshots: Callable[[], Sequence[StageSnapshot]]) -> None:
        """Read gauges from ``snapshots`` (the pipeline's pools) at each collection."""
        self._snapshots = snapshots

    def slot_granted(self, stage: Stage, wait_s: float) -> None:
        """Count an entry into ``stage`` and its queue wait."""
        self._entered.add(1, {"stage": stage.value})
        self._wait.record(wait_s, {"stage": stage.value})

    def slot_released(self, stage: Stage, residence_s: float) -> None:
        """Count an exit from ``stage`` and its residence time."""
        self._exited.add(1, {"stage": stage.value})
        self._residence.record(residence_s, {"stage": stage.value})

    def session_finished(self, status: TerminalStatus) -> None:
        """Count a session that reached ``status``."""
        self._finished.add(1, {"status": status.value})

    def _observe(self, value: Callable[[StageSnapshot], int]) -> Iterable[Observation]:
        return [Observation(value(s), {"stage": s.stage.value}) for s in self._snapshots()]

    def _observe_queue(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._observe(lambda s: s.queue_length)

    def _observe_occupancy(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._observe(lambda s: s.occupancy)

    def _observe_workers(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._observe(lambda s: s.workers)


class MetricsEndpoint:
    """A meter provider exported on a Prometheus ``/metrics`` HTTP endpoint with its own registry.

    Attributes:
        meter_provider: Provider whose instruments the endpoint serves.
        port: The bound port (0 until started), or -1 when disabled.
    """

    def __init__(self, *, service_name: str = "polar-gateway") -> None:
        self._registry = CollectorRegistry()
        self._reader = PrometheusMetricReader(registry=self._registry)
        views = [
            View(
                instrument_type=Histogram,
                instrument_name="polar_gateway_stage_*",
                aggregation=ExplicitBucketHistogramAggregation(_BUCKETS),
            )
        ]
        self.meter_provider = MeterProvider(
            metric_readers=[self._reader],
            resource=Resource.create({"service.name": service_name}),
            views=views,
        )
        self._server: WSGIServer | None = None
        self._stopped = False
        self.port = 0

    def start(self, host: str, port: int) -> int:
        """Serve ``/metrics`` on ``host:port`` (0 picks a port; -1 serves nothing) and return the port."""
        if port < 0:
            self.port = -1
            return -1
        server, _thread = start_http_server(port, addr=host, registry=self._registry)
        self._server = server
        self.port = server.server_port
        return self.port

    def stop(self) -> None:
        """Stop serving and shut the meter provider down. Idempotent."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if not self._stopped:
            self._stopped = True
            self.meter_provider.shutdown()
