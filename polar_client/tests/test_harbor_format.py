"""Harbor task directories read with the ``harbor`` package's task model (no Docker: ``build=False``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from polar_client import load_task, task_from_mapping
from polar_client.formats import harbor
from polar_core.errors import InvalidArgument

REPO = Path(__file__).resolve().parents[2]
TOML = """\
version = "1.0"

[metadata]
difficulty = "easy"
category = "file-operations"

[verifier]
timeout_sec = 90.0

[verifier.env]
GREETING = "hello"

[agent]
timeout_sec = 45.0

[environment]
build_timeout_sec = 300.0
"""


def _task(root: Path, name: str = "hello-world", toml: str = TOML) -> Path:
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text(toml)
    (task / "instruction.md").write_text("Create /app/hello.txt containing Hello, world!\n")
    (task / "environment" / "Dockerfile").write_text("FROM polar-test-python:bookworm\nWORKDIR /app\n")
    (task / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    return task


def test_a_task_directory_becomes_a_docker_task_graded_by_its_tests(tmp_path: Path) -> None:
    task = _task(tmp_path)
    assert harbor.detect(task)
    assert harbor.detect(task / "task.toml")
    assert not harbor.is_dataset(task)
    mapping = harbor.task_mapping(task, build=False)
    assert mapping["task_id"] == "hello-world"
    assert mapping["instruction"].startswith("Create /app/hello.txt")
    assert mapping["timeout_seconds"] == 45.0  # [agent] timeout_sec
    assert mapping["runtime"]["kind"] == "docker"
    assert mapping["runtime"]["image"].startswith("polar-harbor/hello-world:")
    assert harbor.built_image(mapping) == mapping["runtime"]["image"]
    evaluator = mapping["evaluator"]
    assert evaluator["strategy"] == "harbor"
    assert evaluator["tests_dir"] == str(task.resolve() / "tests")
    assert evaluator["verifier_timeout_seconds"] == 90.0  # [verifier] timeout_sec
    assert evaluator["env"] == {"GREETING": "hello"}
    assert evaluator["repo"] == mapping["metadata"]["repo"]
    assert Path(evaluator["repo"]).is_relative_to(task.resolve() / harbor.BUILD_DIR)
    proto = task_from_mapping(mapping)
    assert proto.evaluator.strategy == "harbor"
    assert proto.runtime.image == mapping["runtime"]["image"]


def test_the_image_tag_follows_the_environment_content(tmp_path: Path) -> None:
    task = _task(tmp_path)
    first = harbor.task_mapping(task, build=False)["runtime"]["image"]
    (task / "instruction.md").write_text("Something else.\n")
    assert harbor.task_mapping(task, build=False)["runtime"]["image"] == first
    (task / "environment" / "Dockerfile").write_text("FROM polar-test-python:bookworm\nWORKDIR /srv/app\n")
    assert harbor.task_mapping(task, build=False)["runtime"]["image"] != first


def test_polar_fields_in_metadata_polar(tmp_path: Path) -> None:
    toml = TOML.replace(
        "[verifier]\n",
        '[metadata.polar]\nnum_samples = 3\nharness = { name = "command", argv = ["true"] }\n\n[verifier]\n',
    )
    mapping = harbor.task_mapping(_task(tmp_path, toml=toml), build=False)
    assert mapping["num_samples"] == 3
    assert mapping["harness"] == {"name": "command", "argv": ["true"]}
    bad = TOML.replace("[verifier]\n", "[metadata.polar]\nrepo = '/etc'\n\n[verifier]\n")
    with pytest.raises(InvalidArgument, match=r"metadata\.polar") as info:
        harbor.task_mapping(_task(tmp_path, "bad", toml=bad), build=False)
    assert info.value.details["field"] == "task.toml metadata.polar"


def test_a_directory_of_tasks_is_a_dataset(tmp_path: Path) -> None:
    _task(tmp_path, "b-task")
    _task(tmp_path, "a-task")
    assert harbor.is_dataset(tmp_path)
    assert not harbor.detect(tmp_path)
    assert [m["task_id"] for m in harbor.task_mappings(tmp_path, build=False)] == ["a-task", "b-task"]
    with pytest.raises(InvalidArgument, match="neither a Harbor task"):
        harbor.task_mappings(tmp_path / "a-task" / "tests", build=False)


def _without_tests(task: Path) -> None:
    (task / "tests" / "test.sh").unlink()


def _without_instruction(task: Path) -> None:
    (task / "instruction.md").unlink()


def _empty_instruction(task: Path) -> None:
    (task / "instruction.md").write_text("  \n")


def _malformed_toml(task: Path) -> None:
    (task / "task.toml").write_text("[verifier\ntimeout_sec = 1\n")


def _mistyped_toml(task: Path) -> None:
    (task / "task.toml").write_text('[verifier]\ntimeout_sec = "soon"\n')


def _without_dockerfile(task: Path) -> None:
    (task / "environment" / "Dockerfile").unlink()


def _linked_test_script(task: Path) -> None:
    (task / "tests" / "test.sh").unlink()
    (task / "tests" / "test.sh").symlink_to("/etc/hostname")


def _instruction_from_the_host(task: Path) -> None:
    (task / "instruction.md").unlink()
    (task / "instruction.md").symlink_to("/etc/hostname")


def _build_context_reaching_out(task: Path) -> None:
    (task / "environment" / "secrets").symlink_to("/etc")


def _tests_elsewhere(task: Path) -> None:
    (task / "tests" / "data").symlink_to("/root")


@pytest.mark.parametrize(
    ("damage", "field"),
    [
        (_without_tests, "tests/test.sh"),
        (_linked_test_script, "tests/"),  # a link out of the task
        (_without_instruction, "instruction.md"),
        (_empty_instruction, "instruction.md"),
        (_malformed_toml, "task.toml"),
        (_mistyped_toml, "task.toml verifier.timeout_sec"),
        (_without_dockerfile, "environment/Dockerfile"),
        (_instruction_from_the_host, "instruction.md"),
        (_build_context_reaching_out, "environment/"),
        (_tests_elsewhere, "tests/"),
    ],
)
def test_bad_task_directories_are_refused_with_the_field(tmp_path: Path, damage, field: str) -> None:
    task = _task(tmp_path)
    damage(task)
    with pytest.raises(InvalidArgument) as info:
        harbor.task_mapping(task, build=False)
    assert info.value.details["field"] == field
    assert field.split()[0] in info.value.message
    with pytest.raises(InvalidArgument) as info:
        load_task(task)  # refused before any image is built
    assert info.value.details["field"] == field


def test_polar_submit_refuses_a_task_without_tests_with_exit_2(tmp_path: Path) -> None:
    task = _task(tmp_path)
    _without_tests(task)
    # Nothing listens on the server address: the task is refused before any connection is made.
    proc = subprocess.run(
        [sys.executable, "-m", "polar_run", "submit", str(task), "--server", "127.0.0.1:9"],
        capture_output=True, text=True, timeout=60, cwd=REPO, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "tests/test.sh" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_operators_image_policy_applies_to_built_images(tmp_path: Path) -> None:
    from runtimes.sandbox_policy import TaskAdmission

    mapping = harbor.task_mapping(_task(tmp_path), build=False)
    with pytest.raises(InvalidArgument, match="image") as info:
        TaskAdmission.of(task_roots=[tmp_path]).check(mapping)
    assert info.value.details["field"] == "image"
    TaskAdmission.of(task_roots=[tmp_path], images=["polar-harbor/*"]).check(mapping)
    with pytest.raises(InvalidArgument, match="task roots") as info:
        TaskAdmission.of(task_roots=[tmp_path / "elsewhere"], images=["polar-harbor/*"]).check(mapping)
    # The trusted tests directory is a host path like the repository: it must lie under the task roots too.
    moved = {**mapping, "metadata": {}, "evaluator": {**mapping["evaluator"], "repo": str(tmp_path)}}
    moved["evaluator"]["tests_dir"] = "/etc"
    with pytest.raises(InvalidArgument) as info:
        TaskAdmission.of(task_roots=[tmp_path], images=["polar-harbor/*"]).check(moved)
    assert info.value.details["field"] == "evaluator.tests_dir"
