"""The run directory of ``polar run`` (see ``docs/run.md``) and the summary printed at the end.

Pure functions from session results (protobuf ``SessionResult``), completion records and the rollout server's
task statistics to JSON rows, so the numbers in the table, ``summary.json`` and the JSONL files agree. What each
session's agent did is kept under ``sessions/<session_id>/`` (:func:`write_session_files`).
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from polar.common.v1 import session_pb2
from rich.console import Console
from rich.table import Table

from polar_client.tensors import as_trace
from polar_core.durations import seconds
from polar_core.policy_version import version_key
from polar_core.records import write_jsonl

__all__ = [
    "COMPLETIONS_FILE",
    "SESSIONS_DIR",
    "SESSIONS_FILE",
    "SUMMARY_FILE",
    "TRACES_FILE",
    "print_summary",
    "session_dir",
    "session_row",
    "summarize",
    "trace_rows",
    "write_run_directory",
    "write_session_files",
]

COMPLETIONS_FILE = "completions.jsonl"
TRACES_FILE = "traces.jsonl"
SESSIONS_FILE = "sessions.jsonl"
SUMMARY_FILE = "summary.json"
SESSIONS_DIR = "sessions"
# Sessions without a learning signal, whatever their reward.
_DROPPED = frozenset({"infra_error", "cancelled"})
_TRUNCATED = frozenset({"agent_timeout", "eval_timeout"})


def trace_rows(result: session_pb2.SessionResult) -> list[dict[str, Any]]:
    """The session's traces as ``traces.jsonl`` objects."""
    return [as_trace(t).to_dict() for t in result.traces]


def session_row(result: session_pb2.SessionResult) -> dict[str, Any]:
    """One ``sessions.jsonl`` object: the contract fields, then per-session statistics."""
    traces = list(result.traces)
    stats = result.statistics
    versions = sorted({v for t in traces for v in t.policy_versions}, key=version_key)
    return {
        "session_id": result.session_id,
        "task_id": result.task_id,
        "status": result.status,
        "reward": result.reward,
        "timings": {k: round(v, 3) for k, v in sorted(result.timings.items())},
        "sample_index": result.sample_index,
        "attempt": result.attempt,
        "duration_s": round(result.timings.get("total", 0.0), 3),
        "calls": int(stats.completions),
        "prompt_tokens": int(stats.prompt_tokens),
        "response_tokens": int(stats.response_tokens),
        "traces": len(traces),
        "trainable_tokens": sum(sum(t.loss_mask) for t in traces),
        "exact_context": all(t.exact_context for t in traces),
        "policy_versions": versions,
        "policy_lag": int(result.policy_lag),
        "gateway_id": result.gateway_id,
        "error_message": result.error_message,
        "patch_bytes": len(result.patch),
        "patch_truncated": result.patch_truncated,
        "tests": dict(sorted(Counter(t.outcome for t in result.test_outcomes).items())),
        "eval_log_ref": result.eval_log_ref,
        "harness_log_truncated": result.harness_log_truncated,
        "files": session_dir(result.session_id),
        "harness_exit_code": result.harness_exit_code if result.HasField("harness_exit_code") else None,
        "dependency_unavailable": result.dependency_unavailable,
    }


def session_dir(session_id: str) -> str:
    """The session's folder in the run directory, ``sessions/<session_id>`` (odd characters made ``_``)."""
    return f"{SESSIONS_DIR}/{re.sub(r'[^A-Za-z0-9._=-]', '_', session_id) or '_'}"


def write_session_files(out: Path, result: session_pb2.SessionResult) -> list[str]:
    """Write what the session's agent did under :func:`session_dir`; return the names written.

    ``patch.diff`` (the collected patch, as capped by the gateway), ``tests.json`` (the evaluator's per-test
    outcomes), ``harness.log`` (the tails of the harness's stdout and stderr) and ``eval.log`` (a copy of the
    evaluation log when ``eval_log_ref`` is a file on this host, as with the embedded stack).
    """
    folder = out / session_dir(result.session_id)
    folder.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    if result.patch:
        (folder / "patch.diff").write_bytes(result.patch)
        written.append("patch.diff")
    if result.test_outcomes:
        tests = [
            {"test_id": t.test_id, "outcome": t.outcome, "duration_s": round(seconds(t.duration), 3)}
            for t in result.test_outcomes
        ]
        (folder / "tests.json").write_text(json.dumps(tests, indent=2) + "\n", encoding="utf-8")
        written.append("tests.json")
    if result.harness_stdout or result.harness_stderr:
        log = f"--- stdout ---\n{result.harness_stdout}\n--- stderr ---\n{result.harness_stderr}\n"
        (folder / "harness.log").write_text(log, encoding="utf-8")
        written.append("harness.log")
    source = Path(result.eval_log_ref) if result.eval_log_ref else None
    if source is not None and source.is_absolute() and source.is_file():
        shutil.copyfile(source, folder / "eval.log")
        written.append("eval.log")
    return written


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def summarize(
    rows: Sequence[Mapping[str, Any]],
    *,
    statistics: Any | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``summary.json`` object: totals and per-status rows computed from ``rows``, plus the server's
    ``TaskStatistics`` (durations, calls, chains, policy age and lag, dropped/retried/truncated, stale sessions)
    when given."""
    by_status: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        by_status[str(row["status"])].append(row)

    def block(group: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return {
            "sessions": len(group),
            "mean_reward": round(_mean([float(r["reward"]) for r in group]), 6),
            "calls": sum(int(r["calls"]) for r in group),
            "trainable_tokens": sum(int(r["trainable_tokens"]) for r in group),
            "traces": sum(int(r["traces"]) for r in group),
        }

    summary: dict[str, Any] = dict(extra or {})
    summary.update(block(rows))
    summary["by_status"] = {status: block(group) for status, group in sorted(by_status.items())}
    summary["sessions_usable"] = sum(1 for r in rows if r["status"] not in _DROPPED)
    summary["sessions_dropped"] = sum(1 for r in rows if r["status"] in _DROPPED)
    summary["sessions_truncated"] = sum(1 for r in rows if r["status"] in _TRUNCATED)
    summary["sessions_retried"] = sum(1 for r in rows if int(r.get("attempt", 1)) > 1)
    durations = [float(r["duration_s"]) for r in rows]
    summary["session_duration_s"] = {
        "mean": round(_mean(durations), 3),
        "max": round(max(durations, default=0.0), 3),
    }
    lags = [int(r.get("policy_lag", 0)) for r in rows]
    summary["policy_lag"] = {"mean": round(_mean([float(v) for v in lags]), 3), "max": max(lags, default=0)}
    if statistics is not None:
        summary["statistics"] = json_format.MessageToDict(
            statistics, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
    return summary


def write_run_directory(
    out: Path,
    *,
    results: Iterable[session_pb2.SessionResult],
    completions: Iterable[Mapping[str, Any]],
    summary: Mapping[str, Any],
) -> dict[str, int]:
    """Write the three JSONL files, ``summary.json`` and each session's folder; return the JSONL line counts."""
    out.mkdir(parents=True, exist_ok=True)
    ordered = sorted(results, key=lambda r: (r.task_id, r.sample_index, r.session_id))
    counts = {
        COMPLETIONS_FILE: write_jsonl(out / COMPLETIONS_FILE, completions),
        TRACES_FILE: write_jsonl(out / TRACES_FILE, (t for r in ordered for t in trace_rows(r))),
        SESSIONS_FILE: write_jsonl(out / SESSIONS_FILE, (session_row(r) for r in ordered)),
    }
    for r in ordered:
        write_session_files(out, r)
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return counts


def _dist(stats: Mapping[str, Any], key: str, unit: str = "") -> str:
    d = stats.get(key) or {}
    if not d.get("count"):
        return "-"
    return " · ".join(f"{k} {d[k]:.1f}{unit}" for k in ("mean", "p50", "p90", "max"))


def print_summary(console: Console, summary: Mapping[str, Any], *, title: str) -> None:
    """Print the sessions-by-status table and the trainer statistics."""
    table = Table(title=title, title_justify="left")
    for name, justify in (
        ("status", "left"),
        ("sessions", "right"),
        ("mean reward", "right"),
        ("calls", "right"),
        ("trainable tokens", "right"),
        ("traces", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]

    def add(name: str, block: Mapping[str, Any], *, style: str = "") -> None:
        table.add_row(
            name,
            str(block["sessions"]),
            f"{block['mean_reward']:.3f}",
            str(block["calls"]),
            str(block["trainable_tokens"]),
            str(block["traces"]),
            style=style,
        )

    for status, block in summary["by_status"].items():
        add(status, block)
    table.add_section()
    add("total", summary, style="bold")
    console.print(table)
    stats = summary.get("statistics") or {}
    lines = [
        ("session duration", _dist(stats, "session_duration_seconds", "s")),
        ("calls per session", _dist(stats, "calls")),
        ("chains per session", _dist(stats, "chains")),
        ("policy age", _dist(stats, "policy_age")),
        ("policy lag", _dist(stats, "policy_lag")),
        (
            "stale resampled / kept",
            f"{stats.get('sessions_stale_resampled', 0)} / {stats.get('sessions_stale_kept', 0)}",
        ),
        (
            "dropped / retried / truncated",
            f"{stats.get('sessions_dropped', summary['sessions_dropped'])} / "
            f"{stats.get('sessions_retried', summary['sessions_retried'])} / "
            f"{stats.get('sessions_truncated', summary['sessions_truncated'])}"
            f"  (attempts {stats.get('attempts_total', '-')})",
        ),
    ]
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        console.print(f"{key:<{width}}  {value}", highlight=False)
