"""``polar run --harness NAME``: every registered harness is checked against its installation before anything
starts (missing: exit 2 with the command that installs it; ``--harness-dir`` honoured), and the setup script
installs every one of them (no ports, nothing installed)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from gateway.harnesses import adapter_names
from polar_core.errors import FailedPrecondition
from polar_run.cli import main
from polar_run.run_config import (
    OWN_PROGRAM_HARNESS,
    RunOverrides,
    find_harness_root,
    harness_install_command,
    harness_program,
    prepare_task,
)

_REPO = Path(__file__).resolve().parents[2]
INSTALLED_HARNESSES = tuple(name for name in adapter_names() if name != OWN_PROGRAM_HARNESS)


def _task_file(tmp: Path) -> Path:
    task_dir = tmp / "task"
    (task_dir / "repo").mkdir(parents=True)
    data = {
        "task_id": "t1",
        "instruction": "Fix it.",
        "evaluator": {"strategy": "swe", "repo": "repo", "fail_to_pass": ["tests/test_x.py::test_y"]},
    }
    path = task_dir / "task.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _install(root: Path, name: str) -> Path:
    """Put an (empty) program where the adapter of ``name`` would start it from ``root``."""
    program = harness_program(name, {}, root)
    assert program is not None, name
    assert program.is_relative_to(root), program
    program.parent.mkdir(parents=True, exist_ok=True)
    program.write_text("#!/bin/sh\n")
    return program


def test_every_harness_but_command_runs_a_program_from_the_installation() -> None:
    # npm CLIs from node_modules/.bin, Python agents from their environment under py/.
    assert {"pi", "opencode", "cline", "continue", "aider", "openhands"} <= set(INSTALLED_HARNESSES)
    root = Path("/h/.harnesses")
    programs = {name: harness_program(name, {}, root) for name in INSTALLED_HARNESSES}
    assert programs["pi"] == root / "node_modules/.bin/pi"
    assert programs["opencode"] == root / "node_modules/.bin/opencode"
    assert programs["cline"] == root / "node_modules/.bin/cline"
    assert programs["continue"] == root / "node_modules/.bin/cn"
    assert programs["aider"] == root / "py/aider/bin/python"
    assert harness_program(OWN_PROGRAM_HARNESS, {"argv": ["true"]}, root) is None
    # A Python agent told to run from an environment of its own brings its program.
    assert harness_program("aider", {"venv": "/opt/aider"}, root) is None


@pytest.mark.parametrize("name", INSTALLED_HARNESSES)
def test_a_missing_harness_is_refused_with_the_command_that_installs_it(name: str, tmp_path: Path) -> None:
    path = _task_file(tmp_path)
    for root in (None, tmp_path / "empty"):
        with pytest.raises(FailedPrecondition) as refused:
            prepare_task(path, RunOverrides(harness=name, harness_root=root))
        message = refused.value.message
        assert f"`{harness_install_command(name)}`" in message
        assert harness_install_command(name) == f"bash scripts/setup_harnesses.sh {name}"
        assert "\n" not in message
        if root is not None:
            assert str(harness_program(name, {}, root)) in message


@pytest.mark.parametrize("name", INSTALLED_HARNESSES)
def test_harness_dir_is_honoured_for_every_harness(name: str, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    _install(elsewhere, name)
    root = find_harness_root([elsewhere])  # what `--harness-dir DIR` gives prepare_task
    assert root == elsewhere.resolve()
    prepared = prepare_task(_task_file(tmp_path), RunOverrides(harness=name, harness_root=root))
    assert prepared.harness == name
    # The gateway's PATH gets the installation's CLIs; the local sandbox may read the whole tree.
    assert prepared.harness_bin_dir == root / "node_modules" / ".bin"
    assert str(root) in prepared.task["runtime"]["read_only_paths"]


@pytest.mark.parametrize("name", ["opencode", "cline", "continue", "aider"])
def test_polar_run_exits_2_naming_the_install_command(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "harnesses"
    empty.mkdir()
    argv = ["run", str(_task_file(tmp_path)), "--out", str(tmp_path / "out"), "--harness", name]
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--harness-dir", str(empty)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("polar: error: ")
    assert err.count("\n") == 1
    assert f"bash scripts/setup_harnesses.sh {name}" in err
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_find_harness_root_takes_python_agents_alone(tmp_path: Path) -> None:
    _install(tmp_path / "py-only", "aider")
    assert find_harness_root([tmp_path / "nope", tmp_path / "py-only"]) == (tmp_path / "py-only").resolve()
    _install(tmp_path / "npm-only", "pi")
    assert find_harness_root([tmp_path / "npm-only"]) == (tmp_path / "npm-only").resolve()
    assert find_harness_root([tmp_path / "nope"]) is None


def test_the_setup_script_installs_every_registered_harness() -> None:
    listed = subprocess.run(
        ["bash", str(_REPO / "scripts" / "setup_harnesses.sh"), "--list"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    assert sorted(listed) == sorted(INSTALLED_HARNESSES)
    # Every pinned npm package is one of the script's harnesses (so "no argument: all" installs all of them).
    script = (_REPO / "scripts" / "setup_harnesses.sh").read_text()
    pinned = json.loads((_REPO / "gateway" / "harnesses" / "npm" / "package.json").read_text())["dependencies"]
    assert pinned
    for package in pinned:
        assert f" {package} " in script, package
    refused = subprocess.run(
        ["bash", str(_REPO / "scripts" / "setup_harnesses.sh"), "no-such-harness"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2
    assert "unknown harness no-such-harness" in refused.stderr


def test_a_docker_task_without_a_docker_engine_is_refused_with_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _task_file(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["harness"] = {"name": "command", "argv": ["true"]}
    data["runtime"] = {"kind": "docker", "image": "python:3.11-slim"}
    path.write_text(yaml.safe_dump(data))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")  # a socket nobody listens on
    with pytest.raises(FailedPrecondition) as refused:
        prepare_task(path)
    assert "`bash scripts/setup.sh --all`" in refused.value.message
    assert "\n" not in refused.value.message
