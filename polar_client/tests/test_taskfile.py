"""The task file's staleness fields: ``max_policy_lag`` and ``stale_policy``."""

from __future__ import annotations

from typing import Any

import pytest
from polar.common.v1 import task_pb2

from polar_client import task_from_mapping
from polar_core.errors import InvalidArgument

BASE = {"task_id": "t", "instruction": "Fix it.", "num_samples": 2}


def test_staleness_fields_reach_the_task() -> None:
    task = task_from_mapping({**BASE, "max_policy_lag": 0, "stale_policy": "resample"})
    assert task.HasField("max_policy_lag")
    assert task.max_policy_lag == 0
    assert task.stale_policy == task_pb2.STALE_POLICY_RESAMPLE
    keep = task_from_mapping({**BASE, "max_policy_lag": 3, "stale_policy": "keep"})
    assert (keep.max_policy_lag, keep.stale_policy) == (3, task_pb2.STALE_POLICY_KEEP)


def test_unset_fields_leave_the_server_defaults() -> None:
    task = task_from_mapping(BASE)
    assert not task.HasField("max_policy_lag")
    assert task.stale_policy == task_pb2.STALE_POLICY_UNSPECIFIED


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_policy_lag", -1, "max_policy_lag"),
        ("max_policy_lag", "2", "max_policy_lag"),
        ("max_policy_lag", True, "max_policy_lag"),
        ("max_policy_lag", 1.5, "max_policy_lag"),
        ("stale_policy", "drop", "stale_policy"),
        ("stale_policy", 2, "stale_policy"),
    ],
)
def test_bad_values_are_refused(field: str, value: Any, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        task_from_mapping({**BASE, field: value})
