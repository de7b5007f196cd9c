from __future__ import annotations

import pytest
from polar.common.v1 import status_pb2

from polar_core.convert import (
    completion_from_proto,
    completion_to_proto,
    status_from_proto,
    status_to_proto,
    trace_from_proto,
    trace_to_proto,
)
from polar_core.errors import InvalidArgument
from polar_core.records import CompletionRecord, TerminalStatus, Trace


def test_completion_round_trips_through_protobuf_with_extras() -> None:
    record = CompletionRecord(
        session_id="s",
        call_id="c2",
        seq=1,
        prompt_token_ids=[1, 2, 3],
        response_token_ids=[4, 5],
        response_logprobs=[-0.25, -1.5],
        protocol="openai_chat",
        model="m",
        policy_version="v3",
        parent_call_id="c1",
        finish_reason="tool_calls",
        request={"messages": [{"role": "user", "content": "hi"}]},
        response={"text": "ok"},
        started_at=1.5,
        ended_at=2.5,
        extra={
            "normalization_rules_fired": ["strip"],
            "tool_call_parse_error": True,
            "sampling": {"temperature": 1.0},
            "backend": "vllm",
            "replica": "r0",
        },
    )
    again = completion_from_proto(completion_to_proto(record))
    assert again == record


def test_completion_without_parent_keeps_none() -> None:
    record = CompletionRecord("s", "c", 0, [1], [2], [-0.5])
    message = completion_to_proto(record)
    assert not message.HasField("parent_call_id")
    assert completion_from_proto(message).parent_call_id is None


def test_trace_round_trips_and_carries_the_status_enum() -> None:
    trace = Trace(
        "s",
        "t",
        0,
        ["c1", "c2"],
        [1],
        [2, 3, 4],
        [1, 0, 1],
        [-0.1, 0.0, -0.2],
        reward=1.0,
        weight=0.5,
        status="agent_timeout",
        exact_context=False,
        policy_versions=["v1", "v2"],
    )
    message = trace_to_proto(trace)
    assert message.terminal_status == status_pb2.TERMINAL_STATUS_AGENT_TIMEOUT
    assert trace_from_proto(message) == trace


@pytest.mark.parametrize("status", list(TerminalStatus))
def test_every_status_maps_both_ways(status: TerminalStatus) -> None:
    assert status_from_proto(status_to_proto(status)) is status


def test_unspecified_status_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="required"):
        status_from_proto(status_pb2.TERMINAL_STATUS_UNSPECIFIED)
