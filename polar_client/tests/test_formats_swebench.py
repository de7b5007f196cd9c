"""SWE-bench instance records read as tasks: the formats dispatcher, each storage form, selection, refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from polar_client import load_task
from polar_client.formats import FORMATS, select_mapping, split_selector
from polar_client.formats.swebench import official_image, task_mappings
from polar_core.convert import struct_to_dict
from polar_core.errors import InvalidArgument
from polar_run.dataset import load_dataset
from polar_run.run_config import load_task_mapping

_EVAL = "cd /testbed\n: '>>>>> Start Test Output'\npytest -rA tests/test_a.py\n: '>>>>> End Test Output'\n"


def _record(instance_id: str = "octo__lib-7", **changes: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "instance_id": instance_id,
        "repo": "octo/lib",
        "base_commit": "0123456789abcdef0123456789abcdef01234567",
        "patch": "diff --git a/lib.py b/lib.py\n",
        "test_patch": "diff --git a/tests/test_a.py b/tests/test_a.py\n",
        "problem_statement": f"Fix the bug of {instance_id}.",
        "FAIL_TO_PASS": '["tests/test_a.py::test_new"]',
        "PASS_TO_PASS": ["tests/test_a.py::test_old"],
        "version": "1.0",
        "environment_setup_commit": "0123456789abcdef0123456789abcdef01234567",
        "eval_script": _EVAL,
        "log_parser": "parse_log_pytest",
        "eval_type": "pass_and_fail",
    }
    record.update(changes)
    return {k: v for k, v in record.items() if v is not None}


def _jsonl(path: Path, *records: dict[str, Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_a_record_becomes_a_task_in_the_instance_image(tmp_path: Path) -> None:
    task = load_task(_jsonl(tmp_path / "one.jsonl", _record()))
    assert task.task_id == "octo__lib-7"
    assert task.instruction == "Fix the bug of octo__lib-7."
    assert task.num_samples == 1
    assert task.runtime.image == "swebench/sweb.eval.x86_64.octo_1776_lib-7:latest"
    assert task.evaluator.strategy == "swebench"
    instance = struct_to_dict(task.evaluator.options)["instance"]
    assert list(instance["FAIL_TO_PASS"]) == ["tests/test_a.py::test_new"]  # JSON text read as a list
    assert "patch" not in instance  # the gold patch never reaches a task
    assert "problem_statement" not in instance
    assert task.metadata["repository"] == "octo/lib"


def test_official_image_names() -> None:
    assert official_image("astropy__astropy-12907") == "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"
    assert official_image("Django__Django-1") == "swebench/sweb.eval.x86_64.django_1776_django-1:latest"


def test_image_field_and_template(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "i.jsonl", _record(image="registry.local/lib:7"))
    assert load_task(path).runtime.image == "registry.local/lib:7"
    (mapping,) = task_mappings(path, image_template="mirror.local/{official}")
    assert mapping["runtime"]["image"] == "mirror.local/swebench/sweb.eval.x86_64.octo_1776_lib-7:latest"


def test_many_records_need_a_selector(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "many.jsonl", _record("a__b-1"), _record("a__b-2"))
    with pytest.raises(InvalidArgument, match=r"holds 2 tasks .*many.jsonl#TASK_ID"):
        load_task(path)
    assert load_task(f"{path}#a__b-2").task_id == "a__b-2"
    assert load_task_mapping(Path(f"{path}#a__b-1"))["task_id"] == "a__b-1"
    with pytest.raises(InvalidArgument, match="no task 'a__b-3'"):
        load_task(f"{path}#a__b-3")
    assert split_selector(path) == (path, "")


def test_generate_takes_the_whole_file(tmp_path: Path) -> None:
    tasks = load_dataset(_jsonl(tmp_path / "many.jsonl", _record("a__b-1"), _record("a__b-2")))
    assert [t.task_id for t in tasks] == ["a__b-1", "a__b-2"]
    assert {t.repository for t in tasks} == {"octo/lib"}


def test_json_parquet_and_saved_dataset_directories(tmp_path: Path) -> None:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [_record("a__b-1"), _record("a__b-2")]
    (tmp_path / "all.json").write_text(json.dumps(records), encoding="utf-8")
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "all.parquet")
    datasets.Dataset.from_list(records).save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"test": datasets.Dataset.from_list(records)}).save_to_disk(str(tmp_path / "saved_dict"))
    for name in ("all.json", "all.parquet", "saved", "saved_dict"):
        ids = [m["task_id"] for m in task_mappings(tmp_path / name)]
        assert ids == ["a__b-1", "a__b-2"], name
        assert load_task(f"{tmp_path / name}#a__b-2").runtime.image.endswith("a_1776_b-2:latest"), name


def test_polar_task_files_are_not_claimed(tmp_path: Path) -> None:
    task = tmp_path / "task.yaml"
    task.write_text("task_id: t\ninstruction: do it\n", encoding="utf-8")
    assert select_mapping(task) is None
    lines = _jsonl(
        tmp_path / "tasks.jsonl", {"task_id": "t", "instruction": "x", "instance_id": "i", "problem_statement": "p"}
    )
    assert select_mapping(lines) is None  # Polar's own JSONL of tasks (it has task_id)
    assert "polar_client.formats.swebench" in FORMATS


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"eval_script": None}, "eval_script"),
        ({"base_commit": None, "version": None}, "base_commit"),
        ({"FAIL_TO_PASS": "not json"}, "FAIL_TO_PASS"),
        ({"PASS_TO_PASS": [1, 2]}, "PASS_TO_PASS"),
        ({"log_parser": "parse_log_nonesuch"}, "log_parser"),
        ({"eval_type": "fail_sometimes"}, "eval_type"),
        ({"eval_script": "pytest tests\n"}, "eval_script"),
        ({"version": 1.0}, "version"),
        ({"polar": {"evaluator": {"strategy": "session_completed"}}}, "polar.evaluator"),
    ],
)
def test_malformed_records_are_refused_with_the_field_named(
    tmp_path: Path, changes: dict[str, Any], field: str
) -> None:
    path = _jsonl(tmp_path / "bad.jsonl", _record(**changes))
    with pytest.raises(InvalidArgument) as info:
        load_task(path)
    assert info.value.details["field"] == field
    assert field.split(".")[-1] in str(info.value)


def test_polar_fields_and_a_host_repository(tmp_path: Path) -> None:
    extra = {"harness": {"name": "command", "argv": ["true"]}, "num_samples": 3, "repo_dir": "repos/lib"}
    (mapping,) = task_mappings(_jsonl(tmp_path / "r.jsonl", _record(polar=extra)))
    assert mapping["harness"] == {"name": "command", "argv": ["true"]}
    assert mapping["num_samples"] == 3
    assert mapping["runtime"] == {"kind": "local"}
    assert mapping["metadata"]["repo"] == mapping["evaluator"]["repo"] == str(tmp_path / "repos" / "lib")
    assert mapping["metadata"]["base_commit"] == _record()["base_commit"]


def test_duplicate_instances_and_non_objects_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="appears twice"):
        task_mappings(_jsonl(tmp_path / "d.jsonl", _record(), _record()))
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps(_record()) + "\n[1]\n", encoding="utf-8")
    with pytest.raises(InvalidArgument, match=r"x.jsonl:2: a SWE-bench record must be a JSON object"):
        task_mappings(path)
