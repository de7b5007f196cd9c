"""``polar generate``: offline data generation over a dataset of tasks, on the embedded stack or, with
``--server``, on a running fleet (:mod:`polar_run.fleet_session`).

Every task is submitted at once (the rollout server schedules them onto the gateways); a session whose
generation was empty is re-run, up to ``empty_retries`` times, as a new task ``<task_id>.retry<k>``. Output
(see ``docs/run.md``): ``ledger.json``, ``sessions.jsonl``, ``traces.jsonl``, ``completions.jsonl``,
``sft/{train,validation}.{jsonl,parquet}`` and ``summary.json``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from polar.common.v1 import session_pb2, task_pb2
from polar.rollout.v1 import rollout_service_pb2
from rich.console import Console
from rich.table import Table

from polar_client import task_from_mapping
from polar_core.errors import InvalidArgument
from polar_core.records import write_jsonl
from polar_run.dataset import (
    DatasetTask,
    Ledger,
    SampleOutcome,
    build_ledger,
    is_empty_generation,
    load_dataset,
    sft_record,
    split_repositories,
)
from polar_run.embedded import EmbeddedStack, StackOptions, context_length
from polar_run.fleet_session import (
    MANIFEST_FILE,
    FleetLost,
    FleetSession,
    FleetTarget,
    load_or_create_run_id,
    prepare_fleet_task,
)
from polar_run.progress import ProgressDisplay, ProgressState
from polar_run.run import (
    EmbeddedSession,
    adopt_library_loggers,
    default_workers,
    make_console,
    prepare_out_dir,
    quiet_model_loading,
    start_logging,
)
from polar_run.run_config import DEFAULT_MODEL, PreparedTask, RunOverrides, prepare_task, task_images
from polar_run.run_output import session_row, trace_rows, write_session_files
from polar_run.settings import RunSettings

__all__ = ["GenerateOptions", "generate", "generate_command", "write_parquet"]

_NOT_MODEL_OUTCOMES = frozenset({"infra_error", "cancelled"})


@dataclasses.dataclass(frozen=True, slots=True)
class GenerateOptions:
    """Everything ``polar generate`` was asked to do.

    Attributes:
        dataset: A JSONL file of tasks or a directory (see :func:`polar_run.dataset.load_dataset`).
        out: Output directory.
        overrides: Command-line overrides applied to every task.
        model: Policy model.
        overwrite: Replace an existing output directory.
        live: Draw a live table instead of plain lines.
        workers: Harnesses run at once (see :func:`polar_run.run.default_workers`).
        empty_retries: Re-runs of a session whose generation was empty.
        validation_fraction: Share of repositories in the validation split.
        fleet: Run on this fleet instead of the embedded stack (``--server``).
        settings: What the command read from the environment (read now when not given).
    """

    dataset: Path
    out: Path
    overrides: RunOverrides = dataclasses.field(default_factory=RunOverrides)
    model: str = DEFAULT_MODEL
    overwrite: bool = False
    live: bool = False
    workers: int | None = None
    empty_retries: int = 1
    validation_fraction: float = 0.1
    fleet: FleetTarget | None = None
    settings: RunSettings = dataclasses.field(default_factory=RunSettings.load)


class _Sessions(Protocol):
    """What generation needs of a stack: :class:`EmbeddedSession` or :class:`FleetSession`."""

    state: ProgressState

    async def submit(self, task: task_pb2.Task) -> str: ...

    def results(self, task_id: str) -> AsyncIterator[session_pb2.SessionResult]: ...

    async def completions(self, result: session_pb2.SessionResult) -> list[dict[str, Any]]: ...

    async def task_info(self, task_id: str) -> rollout_service_pb2.TaskInfo: ...


@dataclasses.dataclass(slots=True)
class _Collected:
    """What one session left: its result, completion records and ledger outcome."""

    task: DatasetTask
    result: session_pb2.SessionResult
    completions: list[dict[str, Any]]
    outcome: SampleOutcome


def _prepare_all(tasks: Sequence[DatasetTask], overrides: RunOverrides) -> list[PreparedTask]:
    prepared = [prepare_task(t.path, overrides, data=t.data) for t in tasks]
    for p in prepared:
        task_from_mapping(p.task)  # fail on a malformed task before anything starts
    first = prepared[0]
    for p in prepared[1:]:
        if (p.backend, p.backend_options) != (first.backend, first.backend_options):
            raise InvalidArgument(
                f"tasks {first.task_id!r} and {p.task_id!r} name different backends; one run serves one backend "
                "(pass --backend)"
            )
    return prepared


async def _run_one(
    session: _Sessions,
    task: DatasetTask,
    prepared: PreparedTask,
    empty_retries: int,
    display: ProgressDisplay,
) -> tuple[list[_Collected], list[str]]:
    collected: list[_Collected] = []
    submitted: list[str] = []
    mapping = dict(prepared.task)
    pending = int(mapping.get("num_samples") or 1)
    for round_index in range(empty_retries + 1):
        if round_index:
            mapping = {**prepared.task, "task_id": f"{prepared.task_id}.retry{round_index}", "num_samples": pending}
            session.state.add_sessions(pending)
        task_id = await session.submit(task_from_mapping(mapping))
        submitted.append(task_id)
        last_round = round_index == empty_retries
        empties = 0
        async for result in session.results(task_id):
            completions = await session.completions(result)  # the final attempt's calls only
            empty = result.status not in _NOT_MODEL_OUTCOMES and is_empty_generation(completions)
            empties += int(empty)
            outcome = SampleOutcome(
                repository=task.repository,
                task_id=task.task_id,
                session_id=result.session_id,
                status=result.status,
                attempts=max(1, int(result.attempt)),
                empty=empty,
                final=not (empty and not last_round),
            )
            collected.append(_Collected(task, result, completions, outcome))
            display.note(f"{result.session_id}  {result.status:<14}{'  (empty)' if empty else ''}")
        if not empties:
            break
        pending = empties
    return collected, submitted


async def _run_all(
    session: _Sessions,
    tasks: Sequence[DatasetTask],
    prepared: Sequence[PreparedTask],
    options: GenerateOptions,
    display: ProgressDisplay,
) -> tuple[list[_Collected], int]:
    """Run every task; return what every session left and the attempts the rollout server counted."""
    per_task = await asyncio.gather(
        *(_run_one(session, t, p, options.empty_retries, display) for t, p in zip(tasks, prepared, strict=True))
    )
    attempts = 0
    for _, task_ids in per_task:
        for task_id in task_ids:
            attempts += int((await session.task_info(task_id)).statistics.attempts_total)
    return [c for group, _ in per_task for c in group], attempts


def _stack_options(options: GenerateOptions, prepared: Sequence[PreparedTask]) -> StackOptions:
    """The embedded stack of a dataset; task paths may lie under the dataset's and each task file's directory."""
    first = prepared[0]
    bin_dirs = {p.harness_bin_dir for p in prepared if p.harness_bin_dir is not None}
    dataset = options.dataset.absolute()
    roots = [dataset if dataset.is_dir() else dataset.parent, *options.overrides.task_roots]
    for p in prepared:
        if p.task_dir.absolute() not in roots:
            roots.append(p.task_dir.absolute())
    return StackOptions(
        state_dir=options.out / "state",
        model=options.model,
        backend=first.backend,
        backend_options=first.backend_options,
        harness_bin_dir=next(iter(bin_dirs)) if bin_dirs else None,
        running_workers=default_workers(first.backend, options.workers),
        context_length=context_length(options.overrides.context_length, options.settings),
        task_roots=tuple(roots),
        allowed_images=tuple(sorted({image for p in prepared for image in task_images(p.task)})),
    )


def check_policy(options: GenerateOptions, prepared: Sequence[PreparedTask]) -> None:
    """Refuse, before anything starts, a task the embedded stack's operator policy would refuse at SubmitTask.

    Raises:
        InvalidArgument: The first such task, named with the reason.
    """
    admission = _stack_options(options, prepared).admission()
    for p in prepared:
        try:
            admission.check(p.task)
        except InvalidArgument as exc:
            raise InvalidArgument(f"task {p.task_id!r}: {exc.message}", details=exc.details) from None


async def _on_embedded(
    options: GenerateOptions, console: Console, tasks: Sequence[DatasetTask]
) -> tuple[list[PreparedTask], list[_Collected], dict[str, Any]]:
    prepared = _prepare_all(tasks, options.overrides)
    first = prepared[0]
    state = ProgressState(sum(int(p.task.get("num_samples") or 1) for p in prepared))
    title = _title(options, tasks, prepared, f"backend {first.backend} ({options.model})")
    display = ProgressDisplay(console, title, state, live=options.live)
    started = time.monotonic()
    console.print(f"starting the embedded stack ({options.model} on {first.backend}) ...", soft_wrap=True)
    quiet_model_loading()
    stack_options = _stack_options(options, prepared)
    async with EmbeddedStack.start(stack_options) as stack:
        console.print(f"stack up in {time.monotonic() - started:.1f}s", soft_wrap=True)
        adopt_library_loggers()
        state.started = time.monotonic()
        with display:
            async with EmbeddedSession.open(stack, state, display.changed) as session:
                collected, attempts = await _run_all(session, tasks, prepared, options, display)
    return prepared, collected, {"model": options.model, "backend": first.backend, "server_attempts": attempts}


async def _on_fleet(
    options: GenerateOptions, fleet: FleetTarget, console: Console, tasks: Sequence[DatasetTask]
) -> tuple[list[PreparedTask], list[_Collected], dict[str, Any]]:
    run_id, resumed = load_or_create_run_id(options.out, fleet.server)
    prepared = [prepare_fleet_task(t, options.overrides, run_id) for t in tasks]
    state = ProgressState(sum(int(p.task.get("num_samples") or 1) for p in prepared))
    where = f"fleet {fleet.server} (run {run_id}{', resumed' if resumed else ''})"
    display = ProgressDisplay(console, _title(options, tasks, prepared, where), state, live=options.live)
    async with FleetSession.open(fleet, state, display.changed) as session:
        console.print(f"{'resuming' if resumed else 'submitting'} run {run_id} on {fleet.server}", soft_wrap=True)
        with display:
            collected, attempts = await _run_all(session, tasks, prepared, options, display)
    return prepared, collected, {"server": fleet.server, "run_id": run_id, "server_attempts": attempts}


def _title(options: GenerateOptions, tasks: Sequence[DatasetTask], prepared: Sequence[PreparedTask], where: str) -> str:
    samples = sum(int(p.task.get("num_samples") or 1) for p in prepared)
    harnesses = ", ".join(sorted({p.harness for p in prepared}))
    counts = f"{len(tasks)} tasks · {samples} samples"
    return f"polar generate · {options.dataset} · {counts} · harness {harnesses} · {where}"


async def generate(options: GenerateOptions, console: Console) -> tuple[Ledger, dict[str, Any]]:
    """Run the dataset and write the output directory; return the ledger and the summary."""
    started = time.monotonic()
    tasks = load_dataset(options.dataset)
    if options.fleet is None:
        prepared, collected, extra = await _on_embedded(options, console, tasks)
    else:
        prepared, collected, extra = await _on_fleet(options, options.fleet, console, tasks)
    ledger = build_ledger(
        ((t.repository, t.task_id, int(p.task.get("num_samples") or 1)) for t, p in zip(tasks, prepared, strict=True)),
        (c.outcome for c in collected),
    )
    splits = split_repositories((t.repository for t in tasks), options.validation_fraction)
    records: dict[str, list[dict[str, Any]]] = {"train": [], "validation": []}
    for c in collected:
        if not c.outcome.accepted:
            continue
        record = sft_record(
            c.completions, task_id=c.task.task_id, session_id=c.result.session_id, repository=c.task.repository
        )
        if record is not None:
            records[splits[c.task.repository]].append(record)
    summary = {**extra, **_write_outputs(options.out, collected, ledger, records, splits)}
    summary["wall_seconds"] = round(time.monotonic() - started, 3)
    (options.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    _print_ledger(console, ledger)
    console.print(
        f"SFT records: train {len(records['train'])}, validation {len(records['validation'])} "
        f"({sum(1 for v in splits.values() if v == 'validation')} of {len(splits)} repositories in validation)"
        f"; written to {options.out}",
        soft_wrap=True,
    )
    return ledger, summary


def _write_outputs(
    out: Path,
    collected: Sequence[_Collected],
    ledger: Ledger,
    records: Mapping[str, list[dict[str, Any]]],
    splits: Mapping[str, str],
) -> dict[str, Any]:
    rows = []
    for c in collected:
        row = session_row(c.result)
        row.update(
            {
                "dataset_task_id": c.task.task_id,
                "repository": c.task.repository,
                "empty": c.outcome.empty,
                "outcome": "accepted" if c.outcome.accepted else (c.outcome.rejection or "retried"),
            }
        )
        rows.append(row)
        write_session_files(out, c.result)
    write_jsonl(out / "sessions.jsonl", rows)
    write_jsonl(out / "traces.jsonl", (t for c in collected for t in trace_rows(c.result)))
    write_jsonl(out / "completions.jsonl", (r for c in collected for r in c.completions))
    (out / "ledger.json").write_text(json.dumps(ledger.to_dict(), indent=2) + "\n", encoding="utf-8")
    sft = out / "sft"
    sft.mkdir(parents=True, exist_ok=True)
    for split, items in records.items():
        write_jsonl(sft / f"{split}.jsonl", items)
        write_parquet(sft / f"{split}.parquet", items)
    return {
        "ledger": ledger.totals.to_dict(),
        "sft_records": {split: len(items) for split, items in records.items()},
        "splits": dict(sorted(splits.items())),
    }


def write_parquet(path: Path, records: Sequence[Mapping[str, Any]]) -> None:
    """Write SFT records as Parquet: ``messages`` a list of structs (tool-call arguments as JSON text),
    ``tools`` as JSON text (tool schemas are free-form), ``task_id``, ``session_id``, ``repo``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    call = pa.struct(
        [
            ("id", pa.string()),
            ("type", pa.string()),
            ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())])),
        ]
    )
    message = pa.struct(
        [
            ("role", pa.string()),
            ("content", pa.string()),
            ("tool_calls", pa.list_(call)),
            ("tool_call_id", pa.string()),
            ("name", pa.string()),
            ("reasoning_content", pa.string()),
        ]
    )
    schema = pa.schema(
        [
            ("messages", pa.list_(message)),
            ("tools", pa.string()),
            ("task_id", pa.string()),
            ("session_id", pa.string()),
            ("repo", pa.string()),
        ]
    )
    columns: dict[str, list[Any]] = {name: [] for name in schema.names}
    for record in records:
        columns["messages"].append(
            [
                {
                    key: m.get(key)
                    for key in ("role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content")
                }
                for m in record["messages"]
            ]
        )
        columns["tools"].append(json.dumps(record["tools"], ensure_ascii=False))
        for key in ("task_id", "session_id", "repo"):
            columns[key].append(record[key])
    pq.write_table(pa.table(columns, schema=schema), path)


def _print_ledger(console: Console, ledger: Ledger) -> None:
    statuses = sorted({s for row in [*ledger.rows, ledger.totals] for s in row.rejected})
    table = Table(title="attempt ledger", title_justify="left")
    for name in ("repository", "tasks", "samples", "sessions", "attempts", "retries", "empty retries", "accepted"):
        table.add_column(name, justify="left" if name == "repository" else "right")
    for status in statuses:
        table.add_column(f"rejected {status}", justify="right")

    def cells(row: Any) -> list[str]:
        values = [row.tasks, row.samples, row.sessions, row.attempts, row.retries, row.empty_retries, row.accepted]
        return [row.repository, *(str(v) for v in values), *(str(row.rejected.get(s, 0)) for s in statuses)]

    for row in ledger.rows:
        table.add_row(*cells(row))
    table.add_section()
    table.add_row(*cells(ledger.totals), style="bold")
    console.print(table)


def generate_command(options: GenerateOptions, *, verbose: bool = False) -> int:
    """Run ``polar generate`` and return its exit code (0: every sample ended; 1: none was usable)."""
    if options.empty_retries < 0:
        raise InvalidArgument("--empty-retries must be at least 0")
    console = make_console()
    tasks = load_dataset(options.dataset)
    # Fail on a bad dataset before touching --out.
    if options.fleet is None:
        check_policy(options, _prepare_all(tasks, options.overrides))
        prepare_out_dir(options.out, overwrite=options.overwrite)
    else:
        for t in tasks:
            prepare_fleet_task(t, options.overrides, "check")
        _prepare_fleet_out(options.out, overwrite=options.overwrite)
    with start_logging(options.out / "polar.log", verbose=verbose):
        try:
            ledger, _ = asyncio.run(generate(options, console))
        except FleetLost as exc:
            print(f"polar: generate: {exc}; rerun the same command to resume", file=sys.stderr)
            return 1
    dropped = sum(ledger.totals.rejected.get(s, 0) for s in _NOT_MODEL_OUTCOMES)
    if ledger.totals.samples and dropped == ledger.totals.samples:
        print("polar: generate: every sample ended without a learning signal (infra_error/cancelled)", file=sys.stderr)
        return 1
    return 0


def _prepare_fleet_out(out: Path, *, overwrite: bool) -> None:
    """Keep an output directory of an earlier ``--server`` run (the rerun resumes it); else as ``polar run``."""
    if (out / MANIFEST_FILE).is_file() and not overwrite:
        return
    prepare_out_dir(out, overwrite=overwrite)
