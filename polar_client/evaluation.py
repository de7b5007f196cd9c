"""The evaluation lane: held-out tasks sampled at a pinned policy version while training goes on.

A trainer starts a *round* right after it moved the fleet to version ``v`` (or before its first step). The round
submits every held-out task as its own rollout task, tagged in its metadata (``polar_eval``: round, pinned
version, the held-out task's id) and named ``<prefix>-eval-v<v>-r<round>-<task>`` — ids no training group uses,
so its sessions never reach a training batch — and follows them with ``WatchTask`` in an asyncio task of its
own, so training keeps stepping meanwhile.

**The pin is checked, not assumed.** The fleet moves on when the trainer's next update lands, and an eval session
still running then samples its later calls from the new weights. Resampling does not help (a resampled session
samples the *current* version, never the pinned one again), and neither does the rollout server's staleness
bound, which is relative to the fleet's current version. So every session is checked against the pin: it
*matches* when every call recorded in its traces carries the pinned version (a session that made no call at all
matches too: nothing was sampled). A session whose calls carry another version — or whose calls were recorded
without a trace that names their version — is *mismatched*: it is listed with the versions it saw and left out
of the round's reward and resolved rate. The round's numbers are thus always the pinned version's; when many
sessions are mismatched, the round is small and says so (``complete`` is false).

Rewards are averaged over matched sessions with a model outcome (``infra_error`` and ``cancelled`` are counted
by status but are not rewards the policy earned), as the trainer's metrics do.

``EvalLane`` appends one JSON object per round to ``report_path`` (see :meth:`EvalRoundReport.to_dict`) and one
per session to ``sessions_path``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import grpc
from polar.common.v1 import session_pb2, task_pb2
from polar.rollout.v1 import rollout_service_pb2 as pb

from polar_core.errors import InvalidArgument
from polar_core.policy_version import parse_version

__all__ = [
    "EvalClient",
    "EvalLane",
    "EvalRoundReport",
    "EvalSession",
    "EvalTask",
    "check_pin",
    "read_reports",
    "summarize_round",
]

_log = logging.getLogger(__name__)
_NOT_EARNED = ("infra_error", "cancelled")
EVAL_METADATA_KEY = "polar_eval"
"""The metadata key that tags an eval task: ``{round, policy_version, task_id}``."""


class EvalClient(Protocol):
    """What the lane needs of :class:`~polar_client.RolloutClient`."""

    async def submit(self, task: Any, *, task_timeout_s: float | None = None) -> pb.SubmitTaskResponse:
        """Submit a task (idempotent by id)."""
        ...

    def watch(self, task_id: str) -> Any:
        """Yield the task's final session results (an async iterator)."""
        ...

    async def cancel(self, task_id: str, reason: str = "") -> pb.TaskInfo:
        """Cancel a task."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class EvalTask:
    """One held-out task of the lane: the task and how many sessions each round samples of it.

    Raises:
        InvalidArgument: No task id, or fewer than one sample.
    """

    task: task_pb2.Task
    samples: int

    def __post_init__(self) -> None:
        if not self.task.task_id:
            raise InvalidArgument("an eval task needs a task_id (it names the task in the reports)")
        if not isinstance(self.samples, int) or isinstance(self.samples, bool) or self.samples < 1:
            raise InvalidArgument(
                f"eval task {self.task.task_id!r}: samples must be an integer >= 1, not {self.samples!r}"
            )


@dataclasses.dataclass(frozen=True, slots=True)
class EvalSession:
    """One eval session as reported: its result and whether it was sampled at the pinned version."""

    round: int
    policy_version: int
    eval_task: str
    task_id: str
    session_id: str
    status: str
    reward: float
    policy_versions: tuple[str, ...]
    matched: bool

    def to_dict(self) -> dict[str, Any]:
        """The ``eval_sessions.jsonl`` object."""
        row = dataclasses.asdict(self)
        row["policy_versions"] = list(self.policy_versions)
        return row


def check_pin(result: session_pb2.SessionResult, pinned: int) -> tuple[bool, tuple[str, ...]]:
    """Whether ``result`` was sampled entirely at version ``pinned``, and the versions its calls carried.

    A session with recorded calls but no trace naming their versions (reconstruction failed) cannot be checked,
    so it does not match.
    """
    versions = tuple(sorted({v for trace in result.traces for v in trace.policy_versions}))
    if not versions:
        return result.statistics.completions == 0, versions
    return all(parse_version(v) == pinned for v in versions), versions


@dataclasses.dataclass(frozen=True, slots=True)
class EvalRoundReport:
    """One evaluation round (one line of the report file).

    Attributes:
        round: The round's index (0, 1, ... over the run).
        policy_version: The pinned version.
        step: The training step whose update produced the version (None: before the first step).
        tasks: Held-out tasks submitted.
        sessions: Sessions counted: finished, matched to the pin.
        sessions_total: Sessions finished, mismatched included.
        mean_reward: Over counted sessions with a model outcome (0.0 when none).
        resolved_rate: Share of those sessions ``resolved``.
        mismatched_sessions: Sessions sampled (partly) at another version, left out of the numbers.
        mismatched: ``{session_id, policy_versions}`` of each.
        by_status: Counted sessions per terminal status.
        by_task: Per held-out task: ``sessions``, ``mean_reward``, ``resolved_rate`` (matched sessions only).
        seconds: From submission to the last result.
    """

    round: int
    policy_version: int
    step: int | None
    tasks: int
    sessions: int
    sessions_total: int
    mean_reward: float
    resolved_rate: float
    mismatched_sessions: int
    mismatched: tuple[dict[str, Any], ...]
    by_status: dict[str, int]
    by_task: dict[str, dict[str, float]]
    seconds: float

    @property
    def complete(self) -> bool:
        """Every finished session was sampled at the pinned version."""
        return self.mismatched_sessions == 0

    def to_dict(self) -> dict[str, Any]:
        """The report line: every attribute, plus ``complete``."""
        row = dataclasses.asdict(self)
        row["mismatched"] = list(self.mismatched)
        row["complete"] = self.complete
        return row


def _rates(sessions: Sequence[EvalSession]) -> tuple[float, float]:
    earned = [s for s in sessions if s.status not in _NOT_EARNED]
    if not earned:
        return 0.0, 0.0
    return statistics.fmean(s.reward for s in earned), sum(s.status == "resolved" for s in earned) / len(earned)


def summarize_round(
    round_index: int,
    version: int,
    step: int | None,
    tasks: Sequence[str],
    sessions: Sequence[EvalSession],
    seconds: float,
) -> EvalRoundReport:
    """The report of one round from its sessions (pure)."""
    counted = [s for s in sessions if s.matched]
    mean, resolved = _rates(counted)
    by_task: dict[str, dict[str, float]] = {}
    for name in tasks:
        mine = [s for s in counted if s.eval_task == name]
        task_mean, task_resolved = _rates(mine)
        by_task[name] = {
            "sessions": len(mine),
            "mean_reward": round(task_mean, 6),
            "resolved_rate": round(task_resolved, 6),
        }
    return EvalRoundReport(
        round=round_index,
        policy_version=version,
        step=step,
        tasks=len(tasks),
        sessions=len(counted),
        sessions_total=len(sessions),
        mean_reward=round(mean, 6),
        resolved_rate=round(resolved, 6),
        mismatched_sessions=len(sessions) - len(counted),
        mismatched=tuple(
            {"session_id": s.session_id, "policy_versions": list(s.policy_versions)} for s in sessions if not s.matched
        ),
        by_status=dict(sorted(Counter(s.status for s in counted).items())),
        by_task=by_task,
        seconds=round(seconds, 3),
    )


def _log_failure(task: asyncio.Task[EvalRoundReport]) -> None:
    """Say at once that a background round failed (:meth:`EvalLane.wait` raises it later)."""
    if not task.cancelled() and task.exception() is not None:
        _log.error("evaluation %s failed: %s", task.get_name(), task.exception())


def _append(path: Path | None, rows: Sequence[dict[str, Any]]) -> None:
    if path is None or not rows:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True) + "\n")


def read_reports(path: Path) -> list[dict[str, Any]]:
    """The rounds a report file holds (none when it does not exist)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class EvalLane:
    """Runs evaluation rounds beside a training loop (see the module docstring).

    Args:
        client: The rollout client (:class:`~polar_client.RolloutClient`).
        tasks: The held-out tasks; at least one, with distinct ids.
        task_id_prefix: Prefix of the rounds' task ids (the run's name).
        report_path: Where each round's report is appended (None: kept in :attr:`reports` only).
        sessions_path: Where each round's sessions are appended (None: not written).
        task_timeout_s: Deadline of each eval task on the rollout server.
        priority: Scheduling priority of the eval tasks (training groups have the task template's, 0 by default;
            a lower one lets training sessions go first).

    Raises:
        InvalidArgument: No task, or two with one id.
    """

    def __init__(
        self,
        client: EvalClient,
        tasks: Sequence[EvalTask],
        *,
        task_id_prefix: str,
        report_path: Path | None = None,
        sessions_path: Path | None = None,
        task_timeout_s: float | None = None,
        priority: int | None = None,
    ) -> None:
        if not tasks:
            raise InvalidArgument("the evaluation lane needs at least one held-out task")
        ids = [t.task.task_id for t in tasks]
        if len(set(ids)) != len(ids):
            raise InvalidArgument(f"eval task ids must be distinct: {sorted(i for i in set(ids) if ids.count(i) > 1)}")
        self._client = client
        self._tasks = tuple(tasks)
        self._prefix = task_id_prefix
        self.report_path = report_path
        self._sessions_path = sessions_path
        self._timeout_s = task_timeout_s
        self._priority = priority
        self.reports: list[EvalRoundReport] = []
        self._next_round = len(read_reports(report_path)) if report_path is not None else 0
        self._rounds: list[asyncio.Task[EvalRoundReport]] = []
        self._submitted: set[str] = set()

    def evaluated(self, version: int) -> bool:
        """Whether a round at ``version`` was reported (in this lane or in the report file it continues)."""
        earlier = read_reports(self.report_path) if self.report_path is not None else []
        return any(int(r["policy_version"]) == version for r in earlier) or any(
            r.policy_version == version for r in self.reports
        )

    def start_round(self, policy_version: int, *, step: int | None = None) -> asyncio.Task[EvalRoundReport]:
        """Start a round pinned to ``policy_version`` in the background; the fleet should serve it now."""
        index = self._next_round
        self._next_round += 1
        task = asyncio.create_task(self.run_round(policy_version, step=step, round_index=index), name=f"eval-r{index}")
        task.add_done_callback(_log_failure)
        self._rounds.append(task)
        return task

    async def run_round(
        self, policy_version: int, *, step: int | None = None, round_index: int | None = None
    ) -> EvalRoundReport:
        """Run one round to its end, append its report and sessions, and return the report."""
        if round_index is None:
            round_index = self._next_round
            self._next_round += 1
        started = time.monotonic()
        submitted = [await self._submit(t, policy_version, round_index) for t in self._tasks]
        per_task = await asyncio.gather(
            *(self._collect(task_id, eval_task, policy_version, round_index) for task_id, eval_task in submitted)
        )
        sessions = [s for group in per_task for s in group]
        report = summarize_round(
            round_index,
            policy_version,
            step,
            [t.task.task_id for t in self._tasks],
            sessions,
            time.monotonic() - started,
        )
        _append(self._sessions_path, [s.to_dict() for s in sessions])
        _append(self.report_path, [report.to_dict()])
        self.reports.append(report)
        _log.info(
            "eval round %d at v%d: %d sessions, mean reward %.3f, resolved %.2f, %d mismatched",
            round_index,
            policy_version,
            report.sessions,
            report.mean_reward,
            report.resolved_rate,
            report.mismatched_sessions,
        )
        return report

    async def _submit(self, eval_task: EvalTask, version: int, round_index: int) -> tuple[str, str]:
        message = task_pb2.Task()
        message.CopyFrom(eval_task.task)
        name = eval_task.task.task_id
        # The version is in the id: a resumed run that restarts this round at this version follows the same task.
        message.task_id = f"{self._prefix}-eval-v{version}-r{round_index:03d}-{name}"
        message.num_samples = eval_task.samples
        message.metadata.update({EVAL_METADATA_KEY: {"round": round_index, "policy_version": version, "task_id": name}})
        if self._priority is not None:
            message.priority = self._priority
        await self._client.submit(message, task_timeout_s=self._timeout_s)
        self._submitted.add(message.task_id)
        return message.task_id, name

    async def _collect(self, task_id: str, eval_task: str, version: int, round_index: int) -> list[EvalSession]:
        sessions: list[EvalSession] = []
        async for result in self._client.watch(task_id):
            matched, versions = check_pin(result, version)
            sessions.append(
                EvalSession(
                    round=round_index,
                    policy_version=version,
                    eval_task=eval_task,
                    task_id=task_id,
                    session_id=result.session_id,
                    status=result.status,
                    reward=float(result.reward),
                    policy_versions=versions,
                    matched=matched,
                )
            )
        self._submitted.discard(task_id)
        return sessions

    async def wait(self) -> list[EvalRoundReport]:
        """Wait for every started round; return the reports of this lane's rounds, in order."""
        if self._rounds:
            await asyncio.gather(*self._rounds)
        return sorted(self.reports, key=lambda r: r.round)

    async def cancel(self, reason: str = "training run ended") -> None:
        """Stop the rounds still running and cancel their tasks on the rollout server (idempotent)."""
        for task in self._rounds:
            task.cancel()
        await asyncio.gather(*self._rounds, return_exceptions=True)
        for task_id in sorted(self._submitted):
            with contextlib.suppress(grpc.aio.AioRpcError):  # e.g. it finished meanwhile
                await self._client.cancel(task_id, reason)
        self._submitted.clear()
