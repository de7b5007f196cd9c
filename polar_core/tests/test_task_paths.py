"""A task file's relative paths are made absolute by every reader, the same way."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from evaluator.convert import evaluator_spec_from_proto
from polar_client import load_task
from polar_core.errors import InvalidArgument
from polar_core.task_paths import resolve_task_paths
from polar_core.testing import make_history_repo


def _task_file(tmp_path: Path) -> Path:
    folder = tmp_path / "tasks" / "t"
    (folder / "repo").mkdir(parents=True)
    (folder / "tests.diff").write_text("diff --git a/x b/x\n")
    path = folder / "task.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "task_id": "t",
                "instruction": "fix it",
                "harness": {"name": "pi"},
                "evaluator": {"strategy": "swe", "repo": "repo", "test_patch": "tests.diff"},
                "metadata": {"repo": "./repo", "language": "python"},
            }
        )
    )
    return path


def test_paths_resolve_against_the_task_folder_and_nothing_else_changes(tmp_path: Path) -> None:
    path = _task_file(tmp_path)
    data = yaml.safe_load(path.read_text())
    out = resolve_task_paths(data, path.parent)
    folder = str(path.parent.resolve())
    assert out["evaluator"] == {"strategy": "swe", "repo": f"{folder}/repo", "test_patch": f"{folder}/tests.diff"}
    assert out["metadata"] == {"repo": f"{folder}/repo", "language": "python"}
    assert data["evaluator"]["repo"] == "repo"  # the input is not modified
    inline = {"evaluator": {"strategy": "swe", "repo": "/abs/repo", "test_patch": "diff --git a/x b/x\n+1\n"}}
    assert resolve_task_paths(inline, path.parent) == inline  # absolute paths and diff text stay as they are
    missing = {"evaluator": {"strategy": "swe", "test_patch": "no-such.diff"}}
    assert resolve_task_paths(missing, path.parent) == missing


def test_the_client_and_the_evaluator_read_the_same_paths(tmp_path: Path, monkeypatch) -> None:
    path = _task_file(tmp_path)
    monkeypatch.chdir(tmp_path)  # a relative task path, read from elsewhere
    task = load_task(Path("tasks/t/task.yaml"))
    folder = str(path.parent.resolve())
    assert task.evaluator.options["repo"] == f"{folder}/repo"
    assert task.evaluator.options["test_patch"] == f"{folder}/tests.diff"
    spec = evaluator_spec_from_proto(task.evaluator)  # what the evaluator gets from the gateway
    assert spec.options == {"repo": f"{folder}/repo", "test_patch": f"{folder}/tests.diff"}


def test_base_commit_is_checked_when_the_task_file_is_read(tmp_path: Path) -> None:
    repo = make_history_repo(tmp_path / "tasks" / "g" / "repo")

    def write(base_commit: object) -> Path:
        path = tmp_path / "tasks" / "g" / "task.yaml"
        evaluator = {"strategy": "swe", "repo": "repo", "base_commit": base_commit, "fail_to_pass": ["t::x"]}
        path.write_text(yaml.safe_dump({"task_id": "g", "instruction": "fix", "evaluator": evaluator}))
        return path

    task = load_task(write(repo.base))
    assert task.evaluator.options["base_commit"] == repo.base
    assert task.evaluator.options["repo"] == str(repo.path)
    assert load_task(write("main")).evaluator.options["base_commit"] == "main"
    with pytest.raises(InvalidArgument, match="plain ref name"):
        load_task(write("HEAD@{1}"))
    with pytest.raises(InvalidArgument, match="is not a commit"):
        load_task(write("deadbeef"))
    with pytest.raises(InvalidArgument, match="is not a commit"):
        load_task(write(1234567))  # read back as text, then looked up
