"""What the dashboard shows, read from the rollout server's store: plain async code, no HTTP here.

:class:`DashboardData` builds one JSON-ready snapshot per call: the recent tasks with their sessions by state
and their rewards (a task is a trainer's group), terminal statuses, gateways with their stage load (from
heartbeats), the policy version and lag, completions over time, and the slowest and the failing sessions. It
reads only the active tasks and the most recent finished ones, so its cost is bounded whatever the store holds.
Nothing here runs unless someone watches the dashboard (see :mod:`rollout_server.dashboard.hub`).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from polar_core.records import TerminalStatus
from rollout_server.models import GatewayRecord, ResultRecord, SessionRecord, SessionState, TaskRecord
from rollout_server.stats import Distribution
from rollout_server.store import Store

__all__ = ["DashboardData", "DataConfig", "jaeger_trace_url", "sessions_by_stage"]

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")
# Statuses that are the infrastructure's or the agent's failure, not just a wrong answer.
_FAILING = frozenset(
    {
        TerminalStatus.INFRA_ERROR,
        TerminalStatus.AGENT_TIMEOUT,
        TerminalStatus.EVAL_TIMEOUT,
        TerminalStatus.INVALID_PATCH,
    }
)
_ERROR_CHARS = 500


@dataclasses.dataclass(frozen=True, slots=True)
class DataConfig:
    """Bounds of one snapshot.

    Attributes:
        finished_tasks: Most recent finished tasks shown besides the active ones.
        max_active_tasks: Most active tasks read (the newest first).
        rows: Rows of the slowest, failing and recent-session tables.
        rate_bucket_s: Width of a bucket of the completions-per-second series.
        jaeger_url: Jaeger's UI, for trace links; empty: no links.
    """

    finished_tasks: int = 20
    max_active_tasks: int = 200
    rows: int = 10
    rate_bucket_s: float = 5.0
    jaeger_url: str = ""


def jaeger_trace_url(jaeger_url: str, task: TaskRecord) -> str:
    """The Jaeger page of the trace the task's sessions run in (they join SubmitTask's trace), or ``""``."""
    match = _TRACEPARENT.match(task.trace_context.get("traceparent", ""))
    if not jaeger_url or match is None or set(match.group(1)) == {"0"}:
        return ""
    return f"{jaeger_url.rstrip('/')}/trace/{match.group(1)}"


@dataclasses.dataclass(slots=True)
class _TaskView:
    task: TaskRecord
    sessions: list[SessionRecord]
    results: list[ResultRecord]
    trace_url: str


class DashboardData:
    """Builds dashboard snapshots from a :class:`Store`.

    Args:
        store: The rollout server's store.
        config: Snapshot bounds and the Jaeger URL.
        clock: Unix-seconds time source.
    """

    def __init__(self, store: Store, config: DataConfig | None = None, *, clock: Callable[[], float] = time.time):
        self.store = store
        self.config = config or DataConfig()
        self.clock = clock

    async def _tasks(self) -> list[_TaskView]:
        active = sorted(await self.store.active_tasks(), key=lambda t: t.seq, reverse=True)
        active = active[: self.config.max_active_tasks]
        seen = {t.task_id for t in active}
        recent = [t for t in await self.store.list_tasks(self.config.finished_tasks + len(active), None, None)]
        finished = [t for t in recent if t.task_id not in seen and t.state.terminal][: self.config.finished_tasks]
        views = []
        for task in sorted([*active, *finished], key=lambda t: t.seq):
            sessions = await self.store.task_sessions(task.task_id)
            results = await self.store.task_results(task.task_id, payload=False)
            views.append(_TaskView(task, sessions, results, jaeger_trace_url(self.config.jaeger_url, task)))
        return views

    async def snapshot(self) -> dict[str, Any]:
        """One snapshot of the run, as JSON-ready data (the shape ``static/dashboard.js`` draws)."""
        now = self.clock()
        views = await self._tasks()
        results = [r for v in views for r in v.results]
        sessions = [s for v in views for s in v.sessions]
        policy = await self.store.current_policy()
        by_state = _count_states(sessions)
        gateways = await self.store.list_gateways()
        return {
            "now": now,
            "tasks": [_task_row(v) for v in views],
            "sessions_by_state": by_state,
            "sessions_by_stage": sessions_by_stage(by_state, gateways, now),
            "statuses": dict(sorted(Counter(r.status.value for r in results).items())),
            "gateways": [_gateway_row(g, now) for g in gateways],
            "policy": {
                "version": policy.version if policy else 0,
                "lag": dataclasses.asdict(Distribution.of([float(r.policy_lag) for r in results if r.gateway_id])),
                "proxies": [
                    {"proxy_id": p.proxy_id, "version": p.version, "paused": p.paused, "error": p.error[:200]}
                    for p in await self.store.list_proxies()
                ],
            },
            "completions": _rate_series(results, self.config.rate_bucket_s),
            "rate_bucket_s": self.config.rate_bucket_s,
            "slowest": _slowest(views, now, self.config.rows),
            "failing": _failing(views, self.config.rows),
            "recent": _recent(views, self.config.rows),
        }


def _stage_load(gateways: Sequence[GatewayRecord], now: float, stage: str, *, queued: bool = False) -> int:
    """Sessions the live gateways report in ``stage`` (holding its slot, and with ``queued`` waiting for one)."""
    total = 0
    for gateway in gateways:
        if gateway.lease_expires_at >= now:
            values = gateway.stage_metrics.get(stage, {})
            total += int(values.get("occupancy", 0)) + (int(values.get("queue_length", 0)) if queued else 0)
    return total


def sessions_by_stage(by_state: dict[str, int], gateways: Sequence[GatewayRecord], now: float) -> dict[str, int]:
    """The sessions in the gateways' stage vocabulary: ``pending``, ``starting``, ``running``, ``postrun``, ``done``.

    The store knows a session is at a gateway (state ``running``), not where in the gateway's pipeline it is; the
    gateways report that in their stage load. So the store's ``running`` is split: ``running`` is the sessions
    whose agent runs (the RUNNING stage's slots), ``postrun`` those evaluated and reconstructed or waiting for it
    (POSTRUN's slots and queue: a session holds no slot while it waits for POSTRUN), and the rest (INIT and
    READY, being prepared) count with the store's ``starting``. The stage load comes from heartbeats and may lag
    the store by one: each part is capped by what is left, so the five always add up to the sessions shown.
    """
    at_gateway = by_state.get(SessionState.RUNNING.value, 0)
    running = min(_stage_load(gateways, now, "running"), at_gateway)
    postrun = min(_stage_load(gateways, now, "postrun", queued=True), at_gateway - running)
    return {
        "pending": by_state.get(SessionState.PENDING.value, 0),
        "starting": by_state.get(SessionState.STARTING.value, 0) + at_gateway - running - postrun,
        "running": running,
        "postrun": postrun,
        "done": by_state.get(SessionState.DONE.value, 0),
    }


def _count_states(sessions: Sequence[SessionRecord]) -> dict[str, int]:
    counts = Counter(s.state.value for s in sessions)
    return {state.value: counts.get(state.value, 0) for state in SessionState}


def _task_row(view: _TaskView) -> dict[str, Any]:
    task = view.task
    by_index = {r.sample_index: r for r in view.results}
    return {
        "task_id": task.task_id,
        "state": task.state.value,
        "num_samples": task.num_samples,
        "submitted_at": task.submitted_at,
        "sessions": _count_states(view.sessions),
        "statuses": dict(sorted(Counter(r.status.value for r in view.results).items())),
        # One point per finished session: (sample index, reward, status); a task is a trainer's group.
        "rewards": [[i, by_index[i].reward, by_index[i].status.value] for i in sorted(by_index)],
        "trace_url": view.trace_url,
    }


def _gateway_row(gateway: GatewayRecord, now: float) -> dict[str, Any]:
    return {
        "gateway_id": gateway.gateway_id,
        "capacity": gateway.capacity,
        "active_sessions": gateway.active_sessions,
        "draining": gateway.draining,
        "alive": gateway.lease_expires_at >= now,
        "stages": {stage: dict(values) for stage, values in sorted(gateway.stage_metrics.items())},
    }


def _rate_series(results: Sequence[ResultRecord], bucket_s: float) -> list[list[float]]:
    """``[bucket start, sessions finished per second in it]`` over the shown tasks' results."""
    times = sorted(r.recorded_at for r in results if r.recorded_at > 0)
    if not times:
        return []
    start = times[0] - times[0] % bucket_s
    counts = Counter(int((t - start) // bucket_s) for t in times)
    last = max(counts)
    return [[start + i * bucket_s, counts.get(i, 0) / bucket_s] for i in range(last + 1)]


def _slowest(views: Sequence[_TaskView], now: float, rows: int) -> list[dict[str, Any]]:
    """Running sessions by time in flight and finished ones by duration, longest first."""
    items: list[dict[str, Any]] = []
    for view in views:
        for s in view.sessions:
            if s.state.in_flight and s.dispatched_at is not None:
                # "in flight", not the store's "running": the store cannot tell the agent running from postrun.
                items.append(_session_item(view, s.session_id, "in flight", now - s.dispatched_at))
        for r in view.results:
            if r.gateway_id:
                items.append(_session_item(view, r.session_id, r.status.value, r.duration_s))
    return sorted(items, key=lambda i: -float(i["seconds"]))[:rows]


def _failing(views: Sequence[_TaskView], rows: int) -> list[dict[str, Any]]:
    """The most recent failed sessions with their error."""
    failed = [
        (r.recorded_at, _session_item(view, r.session_id, r.status.value, r.duration_s, r.error_message))
        for view in views
        for r in view.results
        if r.status in _FAILING
    ]
    return [item for _, item in sorted(failed, key=lambda f: -f[0])[:rows]]


def _recent(views: Sequence[_TaskView], rows: int) -> list[dict[str, Any]]:
    """The most recently finished sessions with their status and reward."""
    done = sorted((r for v in views for r in v.results), key=lambda r: -r.recorded_at)[:rows]
    urls = {v.task.task_id: v.trace_url for v in views}
    return [
        {
            "session_id": r.session_id,
            "task_id": r.task_id,
            "status": r.status.value,
            "reward": r.reward,
            "seconds": round(r.duration_s, 3),
            "trace_url": urls.get(r.task_id, ""),
        }
        for r in done
    ]


def _session_item(view: _TaskView, session_id: str, state: str, seconds: float, error: str = "") -> dict[str, Any]:
    item: dict[str, Any] = {
        "session_id": session_id,
        "task_id": view.task.task_id,
        "state": state,
        "seconds": round(seconds, 3),
        "trace_url": view.trace_url,
    }
    if error:
        item["error"] = error[:_ERROR_CHARS]
    return item
