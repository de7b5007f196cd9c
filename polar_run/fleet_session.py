"""``polar generate --server``: offline generation on a running fleet (a rollout server, its gateways and proxies).

:class:`FleetSession` offers what :class:`polar_run.run.EmbeddedSession` offers ``polar generate`` (submit a
task, follow its results, read a session's completion records), against services that run elsewhere:

* **submit** is idempotent: the task ids are ``<run id>.<dataset task id>`` (the run id is kept in
  ``OUT/fleet.json``), so a task that is already on the server — submitted by an earlier invocation with the
  same ``--out``, or by this one just before a lost reply — is followed, not run again;
* **results** come from ``WatchTask``; a dropped stream is reopened from the next result index, and a task
  whose count of results disagrees with the server's at the end is reconciled with ``GetTask``, so every result
  is seen exactly once;
* **completion records** come from the model proxies the rollout server knows (``GetPolicy``; proxies register
  with ``POLAR_PROXY_ROLLOUT_ADDRESS``) plus any ``--proxy``: each is asked for the session, and the records
  the session's traces name are kept (a session retried on another host left records on both).

Every call to the rollout server is retried while it is unreachable (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``),
for up to :data:`RECONNECT_LIMIT_S` of continuous outage; a server unreachable when the command starts, or
one that refuses the token, is a usage error. A failed call becomes a :mod:`polar_core.errors` error through the
one client-side mapper, :func:`polar_core.rpc_client.error_from_rpc`; nothing here reads a status code.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc
from polar.common.v1 import session_pb2, task_pb2
from polar.rollout.v1 import rollout_service_pb2

from polar_client import RolloutClient, task_from_mapping
from polar_core.channels import open_channel
from polar_core.errors import (
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    PermissionDenied,
    PolarError,
    Unauthenticated,
    Unavailable,
)
from polar_core.rpc_client import error_from_rpc, rpc
from polar_core.task_paths import resolve_task_paths
from polar_core.tls import TlsFiles
from polar_run.dataset import DatasetTask
from polar_run.progress import ProgressState
from polar_run.run import list_completions
from polar_run.run_config import PreparedTask, RunOverrides, check_harness_launch, harness_overrides

__all__ = [
    "MANIFEST_FILE",
    "RECONNECT_LIMIT_S",
    "FleetLost",
    "FleetSession",
    "FleetTarget",
    "load_or_create_run_id",
    "prepare_fleet_task",
]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

MANIFEST_FILE = "fleet.json"
# How long the rollout server may stay unreachable mid-generation before the command gives up.
RECONNECT_LIMIT_S = 300.0
# How long the server may take to answer the first call before the command calls it unreachable.
_STARTUP_LIMIT_S = 10.0
_TRANSIENT = (Unavailable, DeadlineExceeded)
# A stream cut by a dying server may also end INTERNAL ("Socket closed") or UNKNOWN (both map to Internal).
_STREAM_TRANSIENT = (*_TRANSIENT, Internal)
_BACKOFF_S = (0.2, 0.5, 1.0, 2.0)
# A watch that keeps failing while the server answers other calls is a fault, not an outage.
_STREAM_FAILURES = 20


class FleetLost(Exception):
    """The rollout server stayed unreachable for longer than :data:`RECONNECT_LIMIT_S` mid-generation."""


@dataclasses.dataclass(frozen=True, slots=True)
class FleetTarget:
    """Where the fleet is and how to reach it.

    Attributes:
        server: ``host:port`` of the rollout server.
        token: The control-plane token.
        tls: mTLS files for the channels, or None for plaintext.
        proxies: Model proxies to read completion records from, beside those the rollout server knows.
    """

    server: str
    token: str = ""
    tls: TlsFiles | None = None
    proxies: tuple[str, ...] = ()


def load_or_create_run_id(out: Path, server: str) -> tuple[str, bool]:
    """The run id kept in ``out/fleet.json`` (and True: resuming), or a new one written there (False).

    Raises:
        InvalidArgument: ``fleet.json`` is unreadable.
    """
    path = out / MANIFEST_FILE
    if path.is_file():
        try:
            run_id = str(json.loads(path.read_text(encoding="utf-8"))["run_id"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InvalidArgument(f"{path} is not a polar generate manifest ({exc}); pass --overwrite") from None
        return run_id, True
    run_id = f"gen-{secrets.token_hex(4)}"
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"run_id": run_id, "server": server}, indent=2) + "\n", encoding="utf-8")
    return run_id, False


def prepare_fleet_task(task: DatasetTask, overrides: RunOverrides, run_id: str) -> PreparedTask:
    """A dataset task as submitted to a fleet: paths absolute, ``--samples``/``--timeout``/``--harness``/
    ``--max-tokens`` applied, the id prefixed with ``run_id``.

    Nothing is checked against this host's installation: the harness CLIs and the backend are the fleet's.

    Raises:
        InvalidArgument: A malformed task or override.
    """
    data = copy.deepcopy(task.data)
    if not data.get("instruction"):
        raise InvalidArgument(f"task {task.task_id!r} has no instruction")
    if overrides.samples is not None:
        if overrides.samples < 1:
            raise InvalidArgument("--samples must be at least 1")
        data["num_samples"] = overrides.samples
    if overrides.timeout_s is not None:
        data["timeout_seconds"] = overrides.timeout_s
    data = resolve_task_paths(data, task.path.parent.resolve())
    backend = dict(data.get("backend") or {})
    harness, options = harness_overrides(data, overrides, str(backend.get("name") or ""))
    check_harness_launch(harness, options, str(data["instruction"]))
    data["harness"] = {"name": harness, **options}
    data["task_id"] = f"{run_id}.{task.task_id}"
    task_from_mapping(data)  # every field checked before anything is submitted
    return PreparedTask(
        task=data,
        task_dir=task.path.parent.resolve(),
        backend=str(backend.get("name") or "fleet"),
        backend_options={},
        model_name=str(backend.get("model_name") or ""),
        harness=harness,
        harness_bin_dir=None,
    )


class FleetSession:
    """A client session against a running fleet (see the module docstring).

    Args:
        target: The fleet.
        state: Progress bookkeeping fed by the results.
        on_change: Called after every progress change.
    """

    def __init__(self, target: FleetTarget, state: ProgressState, on_change: Callable[[], None]) -> None:
        self.target = target
        self.state = state
        self._on_change = on_change
        self.client = RolloutClient(target.server, token=target.token, timeout_s=30.0, tls=target.tls)
        self._proxies: dict[str, grpc.aio.Channel] = {}
        self._call_ids: dict[str, set[str]] = {}

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls, target: FleetTarget, state: ProgressState, on_change: Callable[[], None]
    ) -> AsyncIterator[FleetSession]:
        """Check the rollout server answers (and accepts the token), find its proxies; close on exit.

        Raises:
            InvalidArgument: The server is unreachable, refuses the token, or knows no proxy and none was given.
        """
        session = cls(target, state, on_change)
        try:
            await session._connect()
            yield session
        finally:
            await session.client.close()
            for channel in session._proxies.values():
                await channel.close(None)

    async def _connect(self) -> None:
        server = self.target.server
        try:
            policy = await self._call(lambda: self.client.get_policy(), "GetPolicy", limit_s=_STARTUP_LIMIT_S)
        except FleetLost:
            raise InvalidArgument(f"cannot reach the rollout server at {server} (is it running?)") from None
        except (Unauthenticated, PermissionDenied) as exc:
            raise Unauthenticated(
                f"the rollout server at {server} refused the token ({exc.code_name}); pass --token or set POLAR_TOKEN"
            ) from None
        except PolarError as exc:
            answer = f"{exc.code_name}: {exc.message.removeprefix('GetPolicy: ')}"
            raise InvalidArgument(f"the rollout server at {server} answered {answer}") from None
        self._add_proxies([p.address for p in policy.proxies if p.address])
        self._add_proxies(list(self.target.proxies))
        if not self._proxies:
            raise FailedPrecondition(
                f"the rollout server at {server} knows no model proxy (a proxy registers with "
                "POLAR_PROXY_ROLLOUT_ADDRESS); pass --proxy HOST:PORT to read completion records from"
            )

    def _add_proxies(self, addresses: list[str]) -> None:
        for address in addresses:
            if address not in self._proxies:
                self._proxies[address] = open_channel(address, auth_token=self.target.token, tls=self.target.tls)

    async def _call(self, call: Callable[[], Awaitable[_T]], what: str, *, limit_s: float = RECONNECT_LIMIT_S) -> _T:
        """Await ``call()``, retrying while the server is unreachable for up to ``limit_s`` in a row.

        Raises:
            FleetLost: Still unreachable after ``limit_s``.
            PolarError: Any other failure (:func:`~polar_core.rpc_client.error_from_rpc`'s error).
        """
        deadline = time.monotonic() + limit_s
        attempt = 0
        while True:
            try:
                return await rpc(call(), what)
            except _TRANSIENT as exc:
                if time.monotonic() > deadline:
                    raise FleetLost(f"{what}: the rollout server at {self.target.server} stayed unreachable") from None
                _log.info("%s: %s; retrying", what, exc.code_name)
            await asyncio.sleep(_BACKOFF_S[min(attempt, len(_BACKOFF_S) - 1)])
            attempt += 1

    async def submit(self, task: task_pb2.Task) -> str:
        """Submit ``task`` (a task already on the server — an earlier run of this command — is followed as is).

        Raises:
            InvalidArgument: The server holds a different task under this id, or rejects the task.
        """
        what = f"SubmitTask {task.task_id}"
        try:
            reply = await self._call(lambda: self.client.submit(task), what)
        except AlreadyExists:
            raise InvalidArgument(
                f"task {task.task_id} is on the server with other content (the dataset or options changed "
                "since this --out was started); pass --overwrite or another --out"
            ) from None
        except InvalidArgument as exc:
            reason = exc.message.removeprefix(f"{what}: ")
            raise InvalidArgument(f"the rollout server rejected task {task.task_id}: {reason}") from None
        if reply.already_existed:
            _log.info("task %s is already on the server; following it", reply.task_id)
        return reply.task_id

    async def results(self, task_id: str) -> AsyncIterator[session_pb2.SessionResult]:
        """Yield the task's session results, each once, resuming ``WatchTask`` after a dropped stream.

        Raises:
            FleetLost: The server stayed unreachable for longer than :data:`RECONNECT_LIMIT_S`.
            PolarError: The watch failed otherwise, or kept failing while the server answered.
        """
        seen: set[str] = set()
        next_index = 0
        failures = 0  # stream failures in a row, with the server answering in between
        while True:
            try:
                # The server numbers results 0, 1, ... in completion order and sends them in that order.
                async for result in self.client.watch(task_id, from_index=next_index, reconnect=False):
                    failures = 0
                    next_index += 1
                    if result.session_id in seen:
                        _log.warning("result of %s seen twice; kept once", result.session_id)
                        continue
                    seen.add(result.session_id)
                    yield self._finished(result)
                break
            except grpc.aio.AioRpcError as exc:
                error = error_from_rpc(exc, f"WatchTask {task_id}")
                failures += 1
                if not isinstance(error, _STREAM_TRANSIENT) or failures > _STREAM_FAILURES:
                    raise error from None
                _log.info("WatchTask %s: %s; resuming at result %d", task_id, error.code_name, next_index)
            await asyncio.sleep(0.5)
            await self.task_info(task_id)  # waits (up to RECONNECT_LIMIT_S) for the server to answer again
        info = await self.task_info(task_id)
        if info.sessions_done != len(seen):
            # Defence in depth: whatever the stream missed, GetTask holds (read page by page).
            async for result in self.client.results(task_id):
                if result.session_id not in seen:
                    seen.add(result.session_id)
                    yield self._finished(result)

    def _finished(self, result: session_pb2.SessionResult) -> session_pb2.SessionResult:
        self._call_ids[result.session_id] = {c for t in result.traces for c in t.call_ids}
        self.state.finished(result.session_id, result.status, result.reward, int(result.statistics.completions))
        self._on_change()
        return result

    async def task_info(self, task_id: str) -> rollout_service_pb2.TaskInfo:
        """The task's state and statistics."""
        reply = await self._call(lambda: self.client.get(task_id, summary_only=True), f"GetTask {task_id}")
        return reply.task

    async def completions(self, result: session_pb2.SessionResult) -> list[dict[str, Any]]:
        """The completion records of the attempt that gave ``result``, from the fleet's proxies, in ``seq`` order.

        Only that attempt's proxy session is read (a failed attempt's calls are never the result's). When the
        result named calls (its traces' ``call_ids``), only those records are kept; else the records of the
        proxy whose last record is the latest.
        """
        session_id = result.session_id
        found: list[list[dict[str, Any]]] = []
        for address, channel in self._proxies.items():
            what = f"ListCompletions {session_id} at proxy {address}"
            rows = await rpc(list_completions(channel, session_id, attempt=result.attempt), what)
            if rows:
                found.append(rows)
        wanted = self._call_ids.get(session_id)
        if wanted:
            rows = [r for group in found for r in group if str(r.get("call_id")) in wanted]
            return sorted(rows, key=lambda r: int(r.get("seq", 0)))
        if not found:
            return []
        return max(found, key=lambda group: max(float(r.get("ended_at") or 0.0) for r in group))
