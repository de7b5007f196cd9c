"""ReportSessionResultStream: a result streamed in parts is recorded once, whole, by the one recording path."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from polar.common.v1 import session_pb2, status_pb2, trace_pb2
from polar.rollout.v1 import rollout_service_pb2 as pb

from polar_core.errors import InvalidArgument
from rollout_server.models import ResultRecord
from rollout_server.servicer import RolloutServicer


class _Context:
    """A servicer context without mTLS (no certificate identity) nor a gateway token."""

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()


class _Core:
    """Records reports by idempotency key, as RolloutCore.report_result does."""

    def __init__(self) -> None:
        self.recorded: dict[str, ResultRecord] = {}

    async def report_result(self, result: ResultRecord) -> bool:
        if result.idempotency_key in self.recorded:
            return True
        self.recorded[result.idempotency_key] = result
        return False


def _messages(traces: int, chunk: int) -> list[pb.ReportSessionResultStreamRequest]:
    all_traces = [trace_pb2.Trace(session_id="s", trace_index=i, prompt_token_ids=[i] * 10) for i in range(traces)]
    result = session_pb2.SessionResult(
        session_id="s",
        status="resolved",
        terminal_status=status_pb2.TERMINAL_STATUS_RESOLVED,
        reward=1.0,
        idempotency_key="s#1",
        gateway_id="g",
        attempt=1,
        traces=all_traces[:chunk],
    )
    messages = [pb.ReportSessionResultStreamRequest(result=result)]
    for start in range(chunk, traces, chunk):
        part = pb.TraceChunk(traces=all_traces[start : start + chunk])
        messages.append(pb.ReportSessionResultStreamRequest(traces=part))
    return messages


async def _stream(messages: list[pb.ReportSessionResultStreamRequest]) -> AsyncIterator[Any]:
    for message in messages:
        yield message


def _servicer(core: _Core) -> RolloutServicer:
    return RolloutServicer(core, None)  # type: ignore[arg-type]


async def test_a_streamed_result_is_joined_in_order_and_recorded_once() -> None:
    core = _Core()
    servicer = _servicer(core)
    messages = _messages(traces=7, chunk=2)
    assert len(messages) == 4
    reply = await servicer.ReportSessionResultStream(_stream(messages), _Context())  # type: ignore[arg-type]
    assert not reply.duplicate
    (recorded,) = core.recorded.values()
    payload = session_pb2.SessionResult.FromString(recorded.payload)
    assert [t.trace_index for t in payload.traces] == list(range(7))
    # A gateway retrying the report sends the whole stream again: a duplicate, nothing added.
    again = await servicer.ReportSessionResultStream(_stream(messages), _Context())  # type: ignore[arg-type]
    assert again.duplicate
    assert len(core.recorded) == 1
    assert len(session_pb2.SessionResult.FromString(core.recorded["s#1"].payload).traces) == 7


async def test_a_stream_without_its_result_first_or_cut_short_records_nothing() -> None:
    core = _Core()
    servicer = _servicer(core)
    messages = _messages(traces=4, chunk=2)
    for bad in (messages[1:], [], [messages[0], messages[0]]):
        with pytest.raises(InvalidArgument):
            await servicer.ReportSessionResultStream(_stream(bad), _Context())  # type: ignore[arg-type]

    async def cut() -> AsyncIterator[Any]:
        yield messages[0]
        raise ConnectionError("the gateway went away")

    with pytest.raises(ConnectionError):
        await servicer.ReportSessionResultStream(cut(), _Context())  # type: ignore[arg-type]
    assert core.recorded == {}
