"""SWE-bench records through the ``polar`` command: ``polar run`` on a JSONL file end to end, and refusals.

``polar run`` drives the whole path on the toml instance of :mod:`integration_tests.support.swebench`: the
record's ``polar`` fields give the ``command`` harness (a small agent loop with a shell tool) and the host
repository; the scripted model's tool call applies the fix; the ``swebench`` strategy grades it with the
official package.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from integration_tests.support.polar_cli import AGENT, read_jsonl, run_polar, write_script
from integration_tests.support.swebench import INSTANCE_ID, make_instance

_FIX = "sed -i 's|bool: lambda v: unicode(v),|bool: lambda v: unicode(v).lower(),|' src/toml/encoder.py"
_SCRIPT = [
    {"text": "<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": _FIX}}) + "\n</tool_call>"},
    {"text": "Booleans are now dumped in lower case."},
]


def _records(tmp_path: Path) -> Path:
    """Two instances of the toml repository (the second a copy under another id), run by the command harness."""
    _, record = make_instance(tmp_path, sys.executable)
    record["polar"] = {
        "repo_dir": "testbed",
        "harness": {"name": "command", "argv": ["python3", "-c", AGENT]},
        "timeout_seconds": 60,
    }
    other = {**record, "instance_id": "uiri__toml-2", "polar": {**record["polar"]}}
    records = tmp_path / "instances.jsonl"
    records.write_text(json.dumps(record) + "\n" + json.dumps(other) + "\n", encoding="utf-8")
    return records


@pytest.mark.slow
def test_polar_run_on_a_records_file(tmp_path: Path) -> None:
    records = _records(tmp_path)
    script = write_script(tmp_path / "fix.jsonl", _SCRIPT)
    out = tmp_path / "run"
    proc = run_polar(
        "run", f"{records}#{INSTANCE_ID}", "--out", str(out), "--backend", "scripted",
        "--backend-option", f"script={script}", "--model", "tiny", "--samples", "1",
        cwd=tmp_path, timeout_s=170,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = read_jsonl(out / "sessions.jsonl")
    assert row["status"] == "resolved", row
    assert row["reward"] == 1.0
    patch = (out / row["files"] / "patch.diff").read_text()
    assert "+            bool: lambda v: unicode(v).lower()," in patch
    assert row["tests"] == {"passed": 3}


@pytest.mark.slow
def test_polar_generate_takes_the_whole_records_file(tmp_path: Path) -> None:
    records = _records(tmp_path)
    script = write_script(tmp_path / "fix.jsonl", _SCRIPT)
    out = tmp_path / "out"
    proc = run_polar(
        "generate", str(records), "--out", str(out), "--backend", "scripted", "--model", "tiny",
        "--backend-option", f"script={script}", cwd=tmp_path, timeout_s=170,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = json.loads((out / "ledger.json").read_text())
    (row,) = ledger["rows"]
    assert row["repository"] == "uiri/toml"
    assert row["tasks"] == 2
    assert row["accepted"] == 2


def test_bad_records_exit_2_naming_the_field(tmp_path: Path) -> None:
    _, record = make_instance(tmp_path)
    del record["FAIL_TO_PASS"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(record) + "\n", encoding="utf-8")
    proc = run_polar("submit", str(bad), "--server", "127.0.0.1:1", cwd=tmp_path, timeout_s=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "lacks FAIL_TO_PASS" in proc.stderr
    assert "Traceback" not in proc.stderr
    record["FAIL_TO_PASS"] = "[]"
    record["log_parser"] = "parse_log_nonesuch"
    bad.write_text(json.dumps(record) + "\n", encoding="utf-8")
    proc = run_polar(
        "run", str(bad), "--out", str(tmp_path / "run"), "--backend", "scripted", cwd=tmp_path, timeout_s=60
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "log_parser 'parse_log_nonesuch'" in proc.stderr
    assert not (tmp_path / "run").exists()
