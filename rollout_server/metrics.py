"""The rollout server's instruments: tasks and sessions by state, dispatch, retries, results, delivery, fleet.

Gauges (tasks, sessions and deliveries by state, gateways and their free slots, the fleet's policy version)
read the latest :class:`~rollout_server.overview.RolloutOverview`, which :class:`OverviewLoop` refreshes every
``metrics_refresh_s``; counters and histograms are recorded where the event happens (the core, the scheduler,
the deliverer). :data:`ROLLOUT_METRICS` declares them all (``docs/observability.md`` lists them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum
from typing import TypeVar

from opentelemetry.metrics import CallbackOptions, MeterProvider, NoOpMeterProvider, Observation

from polar_core.metrics import InstrumentKind, MetricSpec, make_instrument
from rollout_server.models import DeliveryState, ResultRecord, SessionState, TaskState
from rollout_server.overview import GatewayLoad, RolloutOverview

__all__ = ["ROLLOUT_METRICS", "RolloutMetrics"]

_C, _H, _G = InstrumentKind.COUNTER, InstrumentKind.HISTOGRAM, InstrumentKind.OBSERVABLE_GAUGE
_REWARD_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 2.0, 5.0, 10.0)
# No negative boundary: the exporter drops a histogram's _sum and _count when one is negative (a negative reward
# counts in le="0").
_LAG_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 16, 32, 64)

_TASKS = MetricSpec("polar.rollout.tasks", _G, "{task}", "Tasks in each state.", ("state",))
_SESSIONS = MetricSpec("polar.rollout.sessions", _G, "{session}", "Sessions in each state.", ("state",))
_DELIVERIES = MetricSpec(
    "polar.rollout.deliveries", _G, "{delivery}", "Result deliveries in each state (dead: dead-lettered).", ("state",)
)
_GATEWAYS = MetricSpec(
    "polar.rollout.gateways", _G, "{gateway}", "Registered gateways: live, draining or expired.", ("state",)
)
_CAPACITY = MetricSpec(
    "polar.rollout.gateway.capacity", _G, "{session}", "Session slots of each gateway.", ("gateway",)
)
_FREE = MetricSpec(
    "polar.rollout.gateway.free", _G, "{session}", "Free session slots of each gateway (0 unless live).", ("gateway",)
)
_VERSION = MetricSpec(
    "polar.rollout.policy.version", _G, "{version}", "The fleet's current policy version (UpdatePolicy's)."
)
_FINISHED = MetricSpec(
    "polar.rollout.sessions.finished", _C, "{session}", "Sessions that finished, by terminal status.", ("status",)
)
_REWARD = MetricSpec(
    "polar.rollout.session.reward", _H, "1", "Reward of each finished session, by status.", ("status",),
    _REWARD_BUCKETS,
)  # fmt: skip
_LAG = MetricSpec(
    "polar.rollout.session.policy_lag",
    _H,
    "{version}",
    "Versions a finished session's oldest call was behind the fleet (sessions whose calls name versions).",
    (),
    _LAG_BUCKETS,
)
_SESSION_DURATION = MetricSpec(
    "polar.rollout.session.duration", _H, "s", "Wall-clock seconds of each finished session's attempt.", ("status",)
)
_DISPATCH = MetricSpec(
    "polar.rollout.dispatch.duration",
    _H,
    "s",
    "Seconds from a session becoming dispatchable (submission, or its retry time) to a gateway accepting it.",
)
_RETRIES = MetricSpec(
    "polar.rollout.session.retries",
    _C,
    "{session}",
    "Sessions queued again, by reason: infra_error, dependency_unavailable, stale_policy, gateway_busy, "
    "gateway_refused.",
    ("reason",),
)
_DELIVERY_LAG = MetricSpec(
    "polar.rollout.delivery.lag", _H, "s", "Seconds from a result being recorded to its callback delivery."
)
_DELIVERED = MetricSpec(
    "polar.rollout.delivery.attempts",
    _C,
    "{attempt}",
    "Callback delivery attempts, by outcome: delivered, retry, dead_lettered.",
    ("outcome",),
)

ROLLOUT_METRICS = (_TASKS, _SESSIONS, _DELIVERIES, _GATEWAYS, _CAPACITY, _FREE, _VERSION, _FINISHED, _REWARD, _LAG,
                   _SESSION_DURATION, _DISPATCH, _RETRIES, _DELIVERY_LAG, _DELIVERED)  # fmt: skip
"""Every instrument of the rollout server."""

Observer = Callable[[CallbackOptions], Iterable[Observation]]
_S = TypeVar("_S", bound=StrEnum)


class RolloutMetrics:
    """Records the rollout server's events; its gauges read :attr:`overview`.

    Args:
        meter_provider: Where the instruments live (a no-op provider by default).
        overview: Returns the latest overview the gauges report (the app passes its
            :class:`~rollout_server.overview.OverviewLoop`'s; by default an empty one, so gauges observe nothing).
    """

    def __init__(
        self, meter_provider: MeterProvider | None = None, *, overview: Callable[[], RolloutOverview] = RolloutOverview
    ) -> None:
        meter = (meter_provider or NoOpMeterProvider()).get_meter("polar.rollout")
        self.overview = overview
        make_instrument(meter, _TASKS, self._states(TaskState, lambda o: o.tasks))
        make_instrument(meter, _SESSIONS, self._states(SessionState, lambda o: o.sessions))
        make_instrument(meter, _DELIVERIES, self._states(DeliveryState, lambda o: o.deliveries))
        make_instrument(meter, _GATEWAYS, self._observe_gateways)
        make_instrument(meter, _CAPACITY, self._per_gateway(lambda g: g.capacity))
        make_instrument(meter, _FREE, self._per_gateway(lambda g: g.free))
        make_instrument(meter, _VERSION, lambda options: [Observation(self.overview().policy_version)])
        self._finished = make_instrument(meter, _FINISHED)
        self._reward = make_instrument(meter, _REWARD)
        self._lag = make_instrument(meter, _LAG)
        self._duration = make_instrument(meter, _SESSION_DURATION)
        self._dispatch = make_instrument(meter, _DISPATCH)
        self._retries = make_instrument(meter, _RETRIES)
        self._delivery_lag = make_instrument(meter, _DELIVERY_LAG)
        self._delivered = make_instrument(meter, _DELIVERED)

    def session_finished(self, result: ResultRecord) -> None:
        """A session's final result was recorded."""
        status = {"status": result.status.value}
        self._finished.add(1, status)
        self._reward.record(result.reward, status)
        self._duration.record(result.duration_s, status)
        if result.policy_versions:
            self._lag.record(result.policy_lag)

    def session_retried(self, reason: str) -> None:
        """A session went back to the queue for ``reason``."""
        self._retries.add(1, {"reason": reason})

    def dispatched(self, waited_s: float) -> None:
        """A gateway accepted a session that had been dispatchable for ``waited_s``."""
        self._dispatch.record(max(waited_s, 0.0))

    def delivery_attempted(self, outcome: str, lag_s: float | None = None) -> None:
        """A callback delivery attempt ended in ``outcome``; ``lag_s`` since the result, when delivered."""
        self._delivered.add(1, {"outcome": outcome})
        if lag_s is not None:
            self._delivery_lag.record(max(lag_s, 0.0))

    def _states(self, states: type[_S], pick: Callable[[RolloutOverview], Mapping[_S, int]]) -> Observer:
        """Observe every state of ``states``, 0 when none is in it, so a state's series never disappears (a panel
        on ``deliveries{state="dead"}`` reads 0, not "No data", while nothing is dead-lettered). Before the first
        overview is taken nothing is observed: zeros would be a claim about a store not yet read."""

        def observe(options: CallbackOptions) -> Iterable[Observation]:
            overview = self.overview()
            if not overview.taken_at:
                return []
            counts = pick(overview)
            return [Observation(counts.get(state, 0), {"state": state.value}) for state in states]

        return observe

    def _per_gateway(self, pick: Callable[[GatewayLoad], int]) -> Observer:
        return lambda options: [Observation(pick(g), {"gateway": g.gateway_id}) for g in self.overview().gateways]

    def _observe_gateways(self, options: CallbackOptions) -> Iterable[Observation]:
        counts: dict[str, int] = {"live": 0, "draining": 0, "expired": 0}
        for g in self.overview().gateways:
            counts[g.state] = counts.get(g.state, 0) + 1
        return [Observation(n, {"state": state}) for state, n in counts.items()]
