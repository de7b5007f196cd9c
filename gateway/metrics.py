"""OpenTelemetry metrics of the session pipeline (served by :class:`polar_core.metrics.MetricsEndpoint`).

Per stage (label ``stage``): ``polar_gateway_stage_queue_length`` and ``polar_gateway_stage_occupancy``
(gauges), ``polar_gateway_stage_entered_total`` and ``polar_gateway_stage_exited_total`` (counters),
``polar_gateway_stage_residence_seconds`` (histogram of time a slot was held) and
``polar_gateway_stage_wait_seconds`` (histogram of time spent queued). Finished sessions are counted by status
in ``polar_gateway_sessions_finished_total``. From outside, Little's law ``L = λW`` for a stage reads: time-averaged
occupancy = rate of ``exited_total`` × (residence ``_sum`` / ``_count``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation

from gateway.models import Stage
from gateway.pools import StageSnapshot
from polar_core.metrics import InstrumentKind, MetricSpec, make_instrument
from polar_core.records import TerminalStatus

__all__ = ["GATEWAY_METRICS", "GatewayMetrics"]

_G, _C, _H = InstrumentKind.OBSERVABLE_GAUGE, InstrumentKind.COUNTER, InstrumentKind.HISTOGRAM
_QUEUE = MetricSpec("polar_gateway_stage_queue_length", _G, "", "Sessions waiting to enter the stage.", ("stage",))
_OCCUPANCY = MetricSpec(
    "polar_gateway_stage_occupancy", _G, "", "Sessions the stage is serving (slots held).", ("stage",)
)
_WORKERS = MetricSpec("polar_gateway_stage_workers", _G, "", "Slots of the stage.", ("stage",))
_ENTERED = MetricSpec("polar_gateway_stage_entered", _C, "", "Sessions that entered the stage.", ("stage",))
_EXITED = MetricSpec("polar_gateway_stage_exited", _C, "", "Sessions that left the stage.", ("stage",))
_RESIDENCE = MetricSpec(
    "polar_gateway_stage_residence", _H, "s", "Seconds a session held the stage's slot.", ("stage",)
)
_WAIT = MetricSpec("polar_gateway_stage_wait", _H, "s", "Seconds a session waited for the stage's slot.", ("stage",))
_FINISHED = MetricSpec(
    "polar_gateway_sessions_finished", _C, "", "Sessions that reached a terminal status.", ("status",)
)
GATEWAY_METRICS = (_QUEUE, _OCCUPANCY, _WORKERS, _ENTERED, _EXITED, _RESIDENCE, _WAIT, _FINISHED)
"""Every instrument of the gateway (names predate the ``polar.*`` dotted style and are kept: scrapes use them)."""


class GatewayMetrics:
    """Records pipeline events as OpenTelemetry instruments (it is the pools' observer)."""

    def __init__(self, meter_provider: MeterProvider) -> None:
        meter = meter_provider.get_meter("polar.gateway")
        self._snapshots: Callable[[], Sequence[StageSnapshot]] = list
        make_instrument(meter, _QUEUE, self._observe_queue)
        make_instrument(meter, _OCCUPANCY, self._observe_occupancy)
        make_instrument(meter, _WORKERS, self._observe_workers)
        self._entered = make_instrument(meter, _ENTERED)
        self._exited = make_instrument(meter, _EXITED)
        self._residence = make_instrument(meter, _RESIDENCE)
        self._wait = make_instrument(meter, _WAIT)
        self._finished = make_instrument(meter, _FINISHED)

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
