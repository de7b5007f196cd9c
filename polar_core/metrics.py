"""The Prometheus endpoint every service shares, and the typed declaration of its instruments.

A service's ``metrics.py`` declares its instruments as :class:`MetricSpec` values (name and unit after the
OpenTelemetry semantic conventions: ``gen_ai.*`` where one applies, ``polar.<service>.*`` otherwise) and makes
them with :func:`make_instrument` on a meter of :attr:`MetricsEndpoint.meter_provider`. The endpoint serves
``/metrics`` from its own Prometheus registry on ``metrics_host:metrics_port`` (0 picks a port, -1 serves
nothing: instruments then come from a no-op meter and cost next to nothing). With ``metrics_token`` set (the
token, or ``sha256:<hex digest>``) the endpoint answers ``401`` to a scrape without ``Authorization: Bearer
<token>`` (Prometheus: ``authorization: {credentials_file: ...}`` in the scrape config).

The Prometheus exporter renames: dots become ``_``, a unit ``s`` appends ``_seconds`` and ``By`` ``_bytes``
(``{token}``-style units append nothing), counters end in ``_total`` and histograms expose ``_bucket``,
``_sum`` and ``_count``. :meth:`MetricSpec.prometheus_name` computes that name, so dashboards and docs can be
checked against the declarations offline.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, NoOpMeterProvider, Observation
from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from polar_core.secret_check import SecretCheck, bearer_token
from polar_core.settings import is_loopback

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

__all__ = [
    "DURATION_BUCKETS_S",
    "TOKEN_BUCKETS",
    "InstrumentKind",
    "MetricSpec",
    "MetricsEndpoint",
    "make_instrument",
    "open_endpoint",
    "prometheus_series",
]

_log = logging.getLogger(__name__)

DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
"""Seconds, from a fast RPC to a long agent run."""

TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576)
"""Token counts (the ``gen_ai.client.token.usage`` boundaries of the semantic conventions, cut at 1M)."""

_UNIT_SUFFIX = {"s": "seconds", "By": "bytes", "ms": "milliseconds"}  # "1" and "{call}"-style units add none

Observer = Callable[[CallbackOptions], Iterable[Observation]]


class InstrumentKind(enum.Enum):
    """The OpenTelemetry instrument a spec makes (and so the Prometheus type it is exported as)."""

    COUNTER = "counter"
    UP_DOWN_COUNTER = "up_down_counter"
    HISTOGRAM = "histogram"
    GAUGE = "gauge"
    OBSERVABLE_GAUGE = "observable_gauge"


@dataclasses.dataclass(frozen=True, slots=True)
class MetricSpec:
    """One instrument of a service.

    Attributes:
        name: OpenTelemetry name (``polar.proxy.calls``, ``gen_ai.server.time_to_first_token``).
        kind: Instrument kind.
        unit: UCUM unit (``s``, ``By``, ``{call}``).
        description: What one observation means.
        labels: Attribute keys every observation carries (some only on failures: see the docs).
        buckets: Histogram bucket boundaries (histograms only; ``DURATION_BUCKETS_S`` by default).
    """

    name: str
    kind: InstrumentKind
    unit: str
    description: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()

    @property
    def prometheus_name(self) -> str:
        """The metric family name the Prometheus exporter gives this instrument."""
        base = self.name.replace(".", "_")
        suffix = _UNIT_SUFFIX.get(self.unit, "")
        if suffix and not base.endswith(suffix):
            base = f"{base}_{suffix}"
        return f"{base}_total" if self.kind is InstrumentKind.COUNTER else base

    @property
    def prometheus_type(self) -> str:
        """``counter``, ``histogram`` or ``gauge`` (up-down counters are exported as gauges)."""
        if self.kind is InstrumentKind.COUNTER:
            return "counter"
        return "histogram" if self.kind is InstrumentKind.HISTOGRAM else "gauge"

    @property
    def prometheus_labels(self) -> tuple[str, ...]:
        """The label names of :attr:`labels` after the exporter's renaming (dots become ``_``)."""
        return tuple(label.replace(".", "_") for label in self.labels)


def prometheus_series(specs: Iterable[MetricSpec]) -> frozenset[str]:
    """Every series name the specs can produce (a histogram's ``_bucket``, ``_sum`` and ``_count`` too)."""
    names: set[str] = set()
    for spec in specs:
        base = spec.prometheus_name
        names.add(base)
        if spec.kind is InstrumentKind.HISTOGRAM:
            names.update((f"{base}_bucket", f"{base}_sum", f"{base}_count"))
    return frozenset(names)


def make_instrument(meter: Meter, spec: MetricSpec, callback: Observer | None = None) -> Any:
    """Create ``spec``'s instrument on ``meter`` (an observable gauge needs its ``callback``)."""
    common: dict[str, Any] = {"unit": spec.unit, "description": spec.description}
    match spec.kind:
        case InstrumentKind.COUNTER:
            return meter.create_counter(spec.name, **common)
        case InstrumentKind.UP_DOWN_COUNTER:
            return meter.create_up_down_counter(spec.name, **common)
        case InstrumentKind.GAUGE:
            return meter.create_gauge(spec.name, **common)
        case InstrumentKind.HISTOGRAM:
            boundaries = list(spec.buckets or DURATION_BUCKETS_S)
            return meter.create_histogram(spec.name, explicit_bucket_boundaries_advisory=boundaries, **common)
        case InstrumentKind.OBSERVABLE_GAUGE:
            if callback is None:
                raise ValueError(f"observable gauge {spec.name} needs a callback")
            return meter.create_observable_gauge(spec.name, callbacks=[callback], **common)


class MetricsEndpoint:
    """A meter provider exported on a Prometheus ``/metrics`` HTTP endpoint with its own registry.

    Each endpoint has its own registry, so several services in one process (``polar serve``, ``polar run``)
    each serve only their own instruments.

    Attributes:
        meter_provider: Provider whose instruments the endpoint serves.
        port: The bound port (0 until started), or -1 when disabled.
    """

    def __init__(self, *, service_name: str, views: Sequence[View] = ()) -> None:
        self._registry = CollectorRegistry()
        self._reader = PrometheusMetricReader(registry=self._registry)
        self.meter_provider = SdkMeterProvider(
            metric_readers=[self._reader],
            resource=Resource.create({"service.name": service_name}),
            views=list(views),
        )
        self._server: WSGIServer | None = None
        self._stopped = False
        self.port = 0

    def start(self, host: str, port: int, *, token: str = "") -> int:
        """Serve ``/metrics`` on ``host:port`` (0 picks a port; -1 serves nothing) and return the port.

        Args:
            host: Interface to bind.
            port: Port; 0 picks one, -1 serves nothing.
            token: The bearer token a scrape must present (or its ``sha256:`` digest); empty: none needed.

        Raises:
            InvalidArgument: ``token`` is a malformed ``sha256:`` digest.
        """
        if port < 0:
            self.port = -1
            return -1
        check = SecretCheck([token], setting="metrics_token")
        if check.open_access and not is_loopback(host):
            _log.warning(
                "metrics on %s:%s need no token: anyone who reaches the port reads them (set metrics_token)", host, port
            )
        app: WSGIApplication = make_wsgi_app(self._registry)
        if not check.open_access:
            app = _bearer_guard(app, check)
        server_class = _server_class(host)
        server = make_server(host, port, app, server_class, handler_class=_QuietHandler)
        threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
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


def open_endpoint(
    service_name: str, host: str, port: int, *, token: str = ""
) -> tuple[MetricsEndpoint | None, MeterProvider]:
    """The started endpoint of a service's ``metrics_host``/``metrics_port`` (``metrics_token``) and its provider.

    Returns:
        ``(endpoint, its provider)``, or ``(None, a no-op provider)`` when ``port`` is -1 (metrics off).
    """
    if port < 0:
        return None, NoOpMeterProvider()
    endpoint = MetricsEndpoint(service_name=service_name)
    try:
        endpoint.start(host, port, token=token)
    except BaseException:
        endpoint.stop()
        raise
    return endpoint, endpoint.meter_provider


_REFUSED = b"metrics need Authorization: Bearer <metrics_token>\n"


def _bearer_guard(app: WSGIApplication, check: SecretCheck) -> WSGIApplication:
    """``app`` behind a bearer-token check: ``401`` (and nothing read) without the token."""

    def guarded(environ: WSGIEnvironment, start_response: StartResponse) -> Any:
        if check(bearer_token(str(environ.get("HTTP_AUTHORIZATION", "")))):
            return app(environ, start_response)
        headers = [
            ("Content-Type", "text/plain; charset=utf-8"),
            ("Content-Length", str(len(_REFUSED))),
            ("WWW-Authenticate", 'Bearer realm="polar-metrics"'),
        ]
        start_response("401 Unauthorized", headers)
        return [_REFUSED]

    return guarded


def _server_class(host: str) -> type[WSGIServer]:
    """prometheus_client's threading WSGI server, in the address family of ``host`` (IPv6 literals included)."""
    family = socket.getaddrinfo(host or None, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

    class Server(ThreadingWSGIServer):
        address_family = family

    return Server


class _QuietHandler(WSGIRequestHandler):
    """No access log on stderr (prometheus_client's own handler is private)."""

    def log_message(self, format: str, *args: Any) -> None:
        return
