"""The model proxy's instruments: calls, latency, tokens, the generation gate, backend errors, record writes.

Names follow the OpenTelemetry GenAI semantic conventions where one exists (the proxy is a GenAI server to
harnesses and a GenAI client of its backend); the rest are ``polar.proxy.*``. :data:`PROXY_METRICS` declares
them all (``docs/observability.md`` lists them). A call is recorded once, at its end, never per token, on the
event loop's next turn after its answer was handed over (:class:`CallMeasurement`); with metrics off the meter
is a no-op one and the engine measures nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, MeterProvider, NoOpMeterProvider, Observation

from polar_core.metrics import TOKEN_BUCKETS, InstrumentKind, MetricSpec, make_instrument
from polar_core.policy_version import parse_version

__all__ = ["PROXY_METRICS", "CallMeasurement", "GateView", "ProxyMetrics"]

_C, _H, _G = InstrumentKind.COUNTER, InstrumentKind.HISTOGRAM, InstrumentKind.OBSERVABLE_GAUGE
_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96,
                    81.92, 163.84, 327.68, 655.36)  # fmt: skip
_PER_TOKEN_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)

_CALLS = MetricSpec(
    "polar.proxy.calls",
    _C,
    "{call}",
    "Model calls answered, by protocol and status (ok, aborted, error; error.type says which error).",
    ("protocol", "status", "error.type"),
)
_DURATION = MetricSpec(
    "gen_ai.server.request.duration",
    _H,
    "s",
    "Seconds from a call's arrival at the engine to its recorded end.",
    ("gen_ai.operation.name", "protocol", "status"),
    _LATENCY_BUCKETS,
)
_TTFT = MetricSpec(
    "gen_ai.server.time_to_first_token",
    _H,
    "s",
    "Seconds from a call's arrival at the engine (render, gate, backend) to the backend's first chunk.",
    ("gen_ai.operation.name", "protocol"),
    _LATENCY_BUCKETS,
)
_PER_TOKEN = MetricSpec(
    "gen_ai.server.time_per_output_token",
    _H,
    "s",
    "Seconds per output token after the first (1 / the call's decode tokens per second).",
    ("gen_ai.operation.name", "protocol"),
    _PER_TOKEN_BUCKETS,
)
_BACKEND_DURATION = MetricSpec(
    "gen_ai.client.operation.duration",
    _H,
    "s",
    "Seconds the backend took for a call, request sent to last chunk.",
    ("gen_ai.operation.name", "backend"),
    _LATENCY_BUCKETS,
)
_TOKENS = MetricSpec(
    "gen_ai.client.token.usage",
    _H,
    "{token}",
    "Tokens per call: gen_ai.token.type input (prompt) or output (sampled response).",
    ("gen_ai.operation.name", "gen_ai.token.type", "protocol"),
    TOKEN_BUCKETS,
)
_BACKEND_ERRORS = MetricSpec(
    "polar.proxy.backend.errors",
    _C,
    "{error}",
    "Backend failures of calls, by backend and error.type (BackendTimeout, BackendUnavailable, Internal, ...).",
    ("backend", "error.type"),
)
_RECORD_WRITE = MetricSpec(
    "polar.proxy.record.write.duration",
    _H,
    "s",
    "Seconds to make a completion record durable (append, and fsync when on).",
    (),
    _LATENCY_BUCKETS,
)
_IN_FLIGHT = MetricSpec("polar.proxy.calls.in_flight", _G, "{call}", "Calls between the gate and their record.")
_PAUSED = MetricSpec("polar.proxy.calls.paused", _G, "{call}", "Calls held at the gate by a pause.")
_GATE = MetricSpec("polar.proxy.generation.paused", _G, "1", "1 while generation is paused (weight update).")
_VERSION = MetricSpec(
    "polar.proxy.policy.version",
    _G,
    "{version}",
    "The policy version stamped on new calls (a label counts as the initial version, 0).",
)

PROXY_METRICS = (_CALLS, _DURATION, _TTFT, _PER_TOKEN, _BACKEND_DURATION, _TOKENS, _BACKEND_ERRORS, _RECORD_WRITE,
                 _IN_FLIGHT, _PAUSED, _GATE, _VERSION)  # fmt: skip
"""Every instrument of the model proxy."""

_CHAT = "chat"


class GateView:
    """What the proxy's gauges read at each scrape (bound by the app to its engine's gate).

    The scrape runs on the endpoint's thread: each reader must be a single atomic read (an ``int``, a
    ``len``), never an iteration over a structure the event loop mutates.
    """

    def __init__(
        self,
        *,
        in_flight: Callable[[], int] = lambda: 0,
        paused_calls: Callable[[], int] = lambda: 0,
        paused: Callable[[], bool] = lambda: False,
        policy_version: Callable[[], str] = lambda: "",
    ) -> None:
        self.in_flight = in_flight
        self.paused_calls = paused_calls
        self.paused = paused
        self.policy_version = policy_version


@dataclasses.dataclass(frozen=True, slots=True)
class CallMeasurement:
    """What one finished call measured (seconds are ``perf_counter`` differences).

    Attributes:
        protocol: The harness's protocol (``openai_chat``, ``anthropic_messages``, ...).
        status: ``ok`` or ``aborted``.
        duration_s: Arrival at the engine to the recorded end.
        ttft_s: Arrival to the backend's first chunk (render, gate wait and prefill included).
        prompt_tokens: Prompt tokens.
        output_tokens: Sampled tokens.
        backend_s: Request sent to the backend to its last chunk.
        decode_s: First chunk to last.
        record_write_s: Seconds to make the completion record durable (``None``: not written yet).
        backend: The backend's name.
    """

    protocol: str
    status: str
    duration_s: float
    ttft_s: float
    prompt_tokens: int
    output_tokens: int
    backend_s: float
    decode_s: float
    record_write_s: float | None
    backend: str


class ProxyMetrics:
    """Records the proxy's calls on OpenTelemetry instruments (the engine and HTTP front call it).

    Attributes:
        enabled: False on a no-op meter provider (metrics off): the engine then skips measuring at all.
    """

    def __init__(self, meter_provider: MeterProvider, view: GateView | None = None) -> None:
        self.enabled = not isinstance(meter_provider, NoOpMeterProvider)
        meter = meter_provider.get_meter("polar.proxy")
        self.view = view or GateView()
        self._calls = make_instrument(meter, _CALLS)
        self._duration = make_instrument(meter, _DURATION)
        self._ttft = make_instrument(meter, _TTFT)
        self._per_token = make_instrument(meter, _PER_TOKEN)
        self._backend = make_instrument(meter, _BACKEND_DURATION)
        self._tokens = make_instrument(meter, _TOKENS)
        self._backend_errors = make_instrument(meter, _BACKEND_ERRORS)
        self._record_write = make_instrument(meter, _RECORD_WRITE)
        make_instrument(meter, _IN_FLIGHT, self._gauge(lambda: self.view.in_flight()))
        make_instrument(meter, _PAUSED, self._gauge(lambda: self.view.paused_calls()))
        make_instrument(meter, _GATE, self._gauge(lambda: int(self.view.paused())))
        make_instrument(meter, _VERSION, self._observe_version)

    def call_finished(self, call: CallMeasurement) -> None:
        """A call that reached the backend ended ``ok`` or ``aborted``: record its latencies and tokens."""
        protocol, status = call.protocol, call.status
        chat = {"gen_ai.operation.name": _CHAT, "protocol": protocol}
        self._calls.add(1, {"protocol": protocol, "status": status})
        self._duration.record(call.duration_s, {**chat, "status": status})
        self._ttft.record(call.ttft_s, chat)
        self._tokens.record(call.prompt_tokens, {**chat, "gen_ai.token.type": "input"})
        self._tokens.record(call.output_tokens, {**chat, "gen_ai.token.type": "output"})
        self._backend.record(call.backend_s, {"gen_ai.operation.name": _CHAT, "backend": call.backend})
        if call.output_tokens > 1:
            self._per_token.record(call.decode_s / (call.output_tokens - 1), chat)
        if call.record_write_s is not None:
            self._record_write.record(call.record_write_s)

    def call_failed(self, protocol: str, exc: BaseException, *, duration_s: float | None = None) -> None:
        """A call ended in an error (refused before the engine, or failed in it) after ``duration_s``."""
        error = type(exc).__name__
        self._calls.add(1, {"protocol": protocol, "status": "error", "error.type": error})
        if duration_s is not None:
            attributes = {"gen_ai.operation.name": _CHAT, "protocol": protocol, "status": "error"}
            self._duration.record(duration_s, attributes)

    def backend_error(self, backend: str, exc: BaseException) -> None:
        """The backend failed a call with ``exc``."""
        self._backend_errors.add(1, {"backend": backend, "error.type": type(exc).__name__})

    def record_written(self, seconds: float) -> None:
        """A completion record became durable in ``seconds``."""
        self._record_write.record(seconds)

    @staticmethod
    def _gauge(read: Callable[[], int]) -> Callable[[CallbackOptions], Iterable[Observation]]:
        return lambda options: [Observation(read())]

    def _observe_version(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(parse_version(self.view.policy_version()))]
