"""The evaluator's domain entry, the evaluation service: Prepare, Evaluate, Release (no gRPC here).

Every evaluation gets a handle and a directory ``<state_dir>/evaluations/<handle>/`` holding its log
(``eval.log``, the ``log_ref``), its JUnit report and its result (``result.json``). A stored result is
returned by every later Evaluate of that handle, even after Release or a restart, so an evaluation never
runs twice. Runtimes are single-use: the one Prepare started is stopped as soon as its evaluation ends.

Status rules (docs/evaluator.md): exceptions from runtimes or strategies, and non-finite rewards, are
``infra_error``, except a runtime's ``DiskQuotaExceeded`` while evaluating (what runs there is the patched
tree's code): ``unresolved`` with the quota in the message; a patch over ``max_patch_bytes`` is
``invalid_patch`` (not applied at all); running past the deadline is ``eval_timeout``; Release during an
evaluation is ``cancelled``; when the agent timed out, its patch is still evaluated and a
``resolved``/``unresolved`` verdict is reported as ``agent_timeout`` with the reward the evaluation gave.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from evaluator.errors import HandleNotFound
from evaluator.evallog import EvalLog
from evaluator.metrics import EvaluatorMetrics
from evaluator.models import Artifacts, EvaluationResult, EvaluatorConfig, PrepareParams
from evaluator.ports import Runtime, RuntimeFactory, Strategy
from evaluator.strategies import EvalContext, EvalTimeout, build_strategy
from evaluator.strategies.base import opt_float
from evaluator.trace_rewards import check_trace_rewards
from polar_core.errors import InvalidArgument, PolarError, Unavailable
from polar_core.records import AgentStatus, TerminalStatus
from polar_core.task_paths import check_task_paths
from runtimes import (
    DefaultRuntimeFactory,
    Isolation,
    OperatorPolicy,
    RuntimeCancelled,
    RuntimeKind,
    RuntimeSpec,
    apply_task_runtime,
)
from runtimes.errors import DiskQuotaExceeded

__all__ = ["EvaluatorService"]

_log = logging.getLogger(__name__)

# Beyond the evaluation's own deadline, how long the backstop waits for a strategy to notice it.
_BACKSTOP_GRACE_S = 30.0
# How long Release waits for a cancelled evaluation to wind down before cancelling its task outright.
_RELEASE_WAIT_S = 30.0
# The warm-up run of the local Python's pytest: a trivial test in a fresh directory, nothing of any task.
_WARM_TEST = "def test_warm():\n    pass\n"
_WARM_TIMEOUT_S = 120.0
_warmed_pythons: set[str] = set()  # once per process and Python


def _warm_pytest(python: str) -> None:
    """Run one trivial pytest session with ``python`` outside any sandbox, writing bytecode (blocking).

    pytest rewrites the assertions of every module of a plugin's distribution (Hypothesis, anyio, ...) and
    caches the result beside the source; a sandbox sees the installation read-only and runs with bytecode
    writing off, so without this every evaluation rewrites them again: ~1 CPU-second of a small suite's
    1.4 on a development install (docs/gateway.md, "Host capacity"). Runs only installed code; failures are
    logged and change nothing else.
    """
    if python in _warmed_pythons:
        return
    _warmed_pythons.add(python)
    with tempfile.TemporaryDirectory(prefix="polar-pytest-warm-") as tmp:
        Path(tmp, "test_warm.py").write_text(_WARM_TEST, encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTEST_ADDOPTS")}
        argv = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_warm.py"]
        try:
            done = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, timeout=_WARM_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            _log.info("warming %s's pytest failed: %s", python, exc)
            return
        if done.returncode != 0:
            _log.info("warming %s's pytest exited %d: %s", python, done.returncode, done.stdout[-500:])


@dataclasses.dataclass
class _Entry:
    strategy: Strategy
    ctx: EvalContext
    task: asyncio.Task[EvaluationResult] | None = None
    released: bool = False


class EvaluatorService:
    """Prepares clean runtimes and scores artifacts in them.

    Args:
        config: The evaluator's config (``app.evaluator_config`` builds it from the settings).
        runtime_factory: Builds runtimes; default: local/docker/apptainer from the spec.
        metrics: Where evaluations and prepares are counted (a no-op by default).
    """

    def __init__(
        self,
        config: EvaluatorConfig,
        *,
        runtime_factory: RuntimeFactory | None = None,
        metrics: EvaluatorMetrics | None = None,
    ) -> None:
        self._metrics = metrics or EvaluatorMetrics()
        self._config = config
        self._factory = runtime_factory or DefaultRuntimeFactory(base_dir=config.runtimes_dir)
        self._entries: dict[str, _Entry] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._warmed: asyncio.Task[None] | None = None
        self.evaluations_run = 0
        """How many evaluations actually ran (stored results returned again do not count)."""

    # -- Prepare -----------------------------------------------------------------------------------------

    async def prepare(self, params: PrepareParams) -> str:
        """Build the evaluation environment; return its handle. Idempotent by ``params.request_id``.

        Raises:
            InvalidArgument: Unknown strategy or malformed options.
            Unavailable: The runtime could not be started or set up in time.
        """
        started = time.monotonic()
        try:
            handle, reused = await self._prepare(params)
        except BaseException:
            self._metrics.prepared("failed", time.monotonic() - started)
            raise
        self._metrics.prepared("reused" if reused else "prepared", time.monotonic() - started)
        return handle

    async def _prepare(self, params: PrepareParams) -> tuple[str, bool]:
        """:meth:`prepare`; also returns whether the handle was prepared already (an idempotent repeat)."""
        if params.request_id:
            handle = "ev-" + hashlib.sha256(params.request_id.encode()).hexdigest()[:24]
        else:
            handle = "ev-" + uuid.uuid4().hex[:24]
        lock = self._locks.setdefault(handle, asyncio.Lock())
        async with lock:
            if handle in self._entries or self._result_path(handle).exists():
                return handle, True
            if self._config.task_roots is not None:
                snapshot = {"repo": params.repository_snapshot} if params.repository_snapshot else {}
                check_task_paths({"evaluator": {**params.spec.options, **snapshot}}, self._config.task_roots)
            strategy = build_strategy(params.spec)
            runtime = None
            if strategy.needs_runtime:
                runtime = self._factory.create(self._runtime_spec(params), session_id=f"eval-{handle}")
            ctx = self._context(handle, params, runtime)
            ctx.deadline = time.monotonic() + self._config.prepare_timeout_s
            ctx.log.write("prepare", f"task={params.task_id} session={params.session_id} "
                          f"strategy={params.spec.strategy}")  # fmt: skip
            try:
                if runtime is not None:
                    await self._warm_local_python(ctx.python, params)
                    await runtime.start()
                await strategy.prepare(ctx)
            except BaseException as exc:
                ctx.log.write("prepare failed", repr(exc))
                if runtime is not None:
                    await asyncio.shield(runtime.stop())
                if isinstance(exc, EvalTimeout):
                    raise Unavailable("preparing the evaluation timed out", retry_after_s=5.0) from None
                raise
            self._entries[handle] = _Entry(strategy=strategy, ctx=ctx)
        return handle, False

    async def _warm_local_python(self, python: str, params: PrepareParams) -> None:
        """Once, before the first local evaluation with the configured Python: :func:`_warm_pytest`."""
        if python != self._config.local_python or self._runtime_spec(params).kind is not RuntimeKind.LOCAL:
            return  # a container's or a task's own Python: not this host's installation
        self._metrics.prewarm(self._warmed is not None and self._warmed.done())
        if self._warmed is None:
            self._warmed = asyncio.create_task(asyncio.to_thread(_warm_pytest, python))
        await asyncio.shield(self._warmed)

    def _runtime_spec(self, params: PrepareParams) -> RuntimeSpec:
        """The task's ``runtime`` table over the evaluator's own options (:mod:`runtimes.sandbox_policy`).

        Raises:
            InvalidArgument: The table is malformed or widens what the evaluator's settings allow.
        """
        raw = params.spec.options.get("runtime") or {}
        if not isinstance(raw, Mapping):
            raise InvalidArgument("evaluator.runtime must be a mapping")
        table: dict[str, Any] = dict(raw)
        if params.image:
            table.setdefault("kind", RuntimeKind.DOCKER.value)
            table["image"] = params.image
        operator: dict[str, Any] = {
            "isolation": self._config.local_isolation,
            "min_isolation": self._config.min_isolation,
            "docker_host": self._config.docker_host or None,
            "memory_limit": self._config.docker_memory_limit,
            "pids_limit": self._config.docker_pids_limit,
            "disk_limit": self._config.disk_limit,
        }
        policy = OperatorPolicy(
            min_isolation=Isolation(self._config.min_isolation),
            read_only_roots=self._config.read_only_roots,
            images=self._config.allowed_images,
        )
        return apply_task_runtime(policy, operator, table)

    def _context(self, handle: str, params: PrepareParams, runtime: Runtime | None) -> EvalContext:
        workdir = self._config.evaluations_dir / handle
        python = params.spec.options.get("python")
        if not isinstance(python, str) or not python:
            local = runtime is None or self._runtime_spec(params).kind is RuntimeKind.LOCAL
            python = self._config.local_python if local else self._config.container_python
        return EvalContext(
            handle=handle,
            params=params,
            options=params.spec.options,
            runtime=runtime,
            log=EvalLog(workdir / "eval.log"),
            workdir=workdir,
            python=python,
        )

    # -- Evaluate ----------------------------------------------------------------------------------------

    async def evaluate(self, handle: str, artifacts: Artifacts, *, timeout_s: float | None = None) -> EvaluationResult:
        """Score ``artifacts`` in the prepared environment; a repeated call returns the first result.

        Raises:
            HandleNotFound: The handle was never prepared (or was released before any evaluation).
        """
        stored = self._load_result(handle)
        if stored is not None:
            return stored
        entry = self._entries.get(handle)
        if entry is None:
            raise HandleNotFound(f"no prepared evaluation {handle!r}", details={"handle": handle})
        if entry.task is None:
            entry.task = asyncio.create_task(self._run(handle, entry, artifacts, timeout_s))
        # Shielded: a caller that goes away must not cancel an evaluation another caller may await.
        return await asyncio.shield(entry.task)

    def _timeout(self, entry: _Entry, timeout_s: float | None) -> float:
        if timeout_s is not None and timeout_s > 0:
            return timeout_s
        from_task = opt_float(entry.ctx.options, "timeout_seconds", None)
        return from_task if from_task else self._config.default_timeout_s

    async def _run(self, handle: str, entry: _Entry, artifacts: Artifacts, timeout_s: float | None) -> EvaluationResult:
        ctx = entry.ctx
        self.evaluations_run += 1
        started = time.monotonic()
        timeout = self._timeout(entry, timeout_s)
        ctx.deadline = started + timeout
        ctx.log.write("evaluate", f"agent_status={artifacts.agent_status.value} timeout={timeout:.0f}s "
                      f"patch_bytes={len(artifacts.patch or b'')}")  # fmt: skip
        self._metrics.evaluation_started()
        status = "error"  # the evaluation raised (a caller's cancellation, a teardown failure)
        try:
            try:
                result = await self._score(entry, artifacts, timeout)
            finally:
                if ctx.runtime is not None:
                    await asyncio.shield(ctx.runtime.stop())
            result = _apply_agent_status(_check_rewards(result, artifacts), artifacts.agent_status)
            status = result.status.value
        finally:
            self._metrics.evaluation_finished(ctx.params.spec.strategy, status, time.monotonic() - started)
        result = dataclasses.replace(
            result, log_ref=str(ctx.log.path.absolute()), duration_s=time.monotonic() - started
        )
        ctx.log.write(f"result: {result.status.value} reward={result.reward}", result.error_message)
        self._store_result(handle, result)
        return result

    async def _score(self, entry: _Entry, artifacts: Artifacts, limit_s: float) -> EvaluationResult:
        if artifacts.agent_status is AgentStatus.CANCELLED:
            return EvaluationResult(0.0, TerminalStatus.CANCELLED, error_message="the agent run was cancelled")
        size = len(artifacts.patch or b"")
        if size > self._config.max_patch_bytes:
            message = f"the patch is {size} bytes, over the evaluator's limit of {self._config.max_patch_bytes} bytes"
            entry.ctx.log.write("the agent's patch is too large", message)
            return EvaluationResult(0.0, TerminalStatus.INVALID_PATCH, error_message=message)
        try:
            async with asyncio.timeout(limit_s + _BACKSTOP_GRACE_S):
                return await entry.strategy.evaluate(entry.ctx, artifacts)
        except (EvalTimeout, TimeoutError) as exc:
            return EvaluationResult(0.0, TerminalStatus.EVAL_TIMEOUT, error_message=str(exc) or "timed out")
        except RuntimeCancelled as exc:
            return EvaluationResult(0.0, TerminalStatus.CANCELLED, error_message=exc.message)
        except DiskQuotaExceeded as exc:
            # Strategies other than swe (which says which tests went missing): the patched code filled the disk.
            entry.ctx.log.write("unresolved: disk quota", exc.message)
            return EvaluationResult(0.0, TerminalStatus.UNRESOLVED, error_message=exc.message)
        except asyncio.CancelledError:
            if not entry.released:
                raise
            return EvaluationResult(0.0, TerminalStatus.CANCELLED, error_message="released while evaluating")
        except PolarError as exc:
            if entry.released:
                return EvaluationResult(0.0, TerminalStatus.CANCELLED, error_message="released while evaluating")
            entry.ctx.log.write("infrastructure error", f"{type(exc).__name__}: {exc.message}")
            return EvaluationResult(0.0, TerminalStatus.INFRA_ERROR, error_message=exc.message)
        except Exception as exc:
            # An evaluator crash (ours or a custom evaluator's) is never the model's failure.
            _log.exception("evaluation %s crashed", entry.ctx.handle)
            entry.ctx.log.write("evaluator crashed", f"{type(exc).__name__}: {exc}")
            return EvaluationResult(0.0, TerminalStatus.INFRA_ERROR, error_message=f"evaluator crashed: {exc!r}")

    # -- Release -----------------------------------------------------------------------------------------

    async def release(self, handle: str) -> bool:
        """Free a prepared environment, cancelling an evaluation in progress. Idempotent.

        Returns:
            Whether the handle was live.
        """
        entry = self._entries.pop(handle, None)
        self._locks.pop(handle, None)
        if entry is None:
            return False
        entry.released = True
        runtime = entry.ctx.runtime
        if entry.task is not None and not entry.task.done():
            # Cancelling the runtime makes the evaluation end on its own with a cancelled result, which is
            # stored; cancelling the task is for strategies without a runtime or ones that do not notice.
            if runtime is not None:
                await runtime.cancel()
                await asyncio.wait([entry.task], timeout=_RELEASE_WAIT_S)
            if not entry.task.done():
                entry.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await entry.task
        elif runtime is not None:
            await runtime.stop()
        return True

    async def close(self) -> None:
        """Release every live handle (on shutdown)."""
        for handle in list(self._entries):
            await self.release(handle)

    # -- Stored results ----------------------------------------------------------------------------------

    def _result_path(self, handle: str) -> Path:
        return self._config.evaluations_dir / handle / "result.json"

    def _load_result(self, handle: str) -> EvaluationResult | None:
        if "/" in handle or handle in ("", ".", ".."):
            raise HandleNotFound(f"no prepared evaluation {handle!r}")
        path = self._result_path(handle)
        try:
            return EvaluationResult.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            return None

    def _store_result(self, handle: str, result: EvaluationResult) -> None:
        path = self._result_path(handle)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(result.to_dict(), indent=2), encoding="utf-8")
        tmp.replace(path)


def _check_rewards(result: EvaluationResult, artifacts: Artifacts) -> EvaluationResult:
    # Per-trace rewards that do not fit the traces, and rewards that are not finite numbers (NaN, ±inf, from a
    # reward.json or a custom evaluator), are the evaluator's failure, told as such (never dropped or passed on):
    # infra_error, reward 0, not trainable, so such a value never reaches a loss or counts as a success.
    bad = [r for r in (result.reward, *result.trace_rewards) if not math.isfinite(r)]
    if bad:
        message = f"invalid evaluator result: non-finite reward {bad[0]!r} refused (rewards must be finite numbers)"
        return EvaluationResult(0.0, TerminalStatus.INFRA_ERROR, result.test_outcomes, error_message=message)
    try:
        check_trace_rewards(artifacts.traces, result.trace_rewards)
    except InvalidArgument as exc:
        return EvaluationResult(0.0, TerminalStatus.INFRA_ERROR, result.test_outcomes, error_message=exc.message)
    return result


def _apply_agent_status(result: EvaluationResult, agent_status: AgentStatus) -> EvaluationResult:
    # A timed-out agent's patch is still judged; the verdict becomes agent_timeout, the reward is kept.
    # Evaluation-side statuses (invalid_patch, eval_timeout, infra_error, cancelled) say more and stay.
    if agent_status is AgentStatus.TIMEOUT and result.status in (
        TerminalStatus.RESOLVED,
        TerminalStatus.UNRESOLVED,
    ):
        return dataclasses.replace(result, status=TerminalStatus.AGENT_TIMEOUT)
    return result
