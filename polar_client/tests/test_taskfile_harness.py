"""The task file's harness section: option keys its adapter does not know are refused with the field named."""

from __future__ import annotations

import pytest

from polar_client import task_from_mapping
from polar_core.errors import InvalidArgument

BASE = {"task_id": "t", "instruction": "Fix it.", "num_samples": 2}


def test_known_options_reach_the_task() -> None:
    task = task_from_mapping({**BASE, "harness": {"name": "pi", "provider_mode": "openai-responses", "env": {"A": 1}}})
    assert task.harness.name == "pi"
    assert dict(task.harness.options)["provider_mode"] == "openai-responses"


@pytest.mark.parametrize(
    ("harness", "field"),
    [
        ({"name": "pi", "provdier_mode": "openai-responses"}, "harness.provdier_mode"),
        ({"name": "codex", "yolo": True}, "harness.yolo"),  # another adapter's option
        ({"name": "claude_code"}, "harness.name"),
        ({"provider_mode": "openai-completions"}, "harness.name"),
    ],
)
def test_unknown_harness_or_option_is_refused_with_the_field(harness: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgument, match=field) as info:
        task_from_mapping({**BASE, "harness": harness})
    assert info.value.details["field"] == field
