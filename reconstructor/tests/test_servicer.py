from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from polar.common.v1 import reconstruction_pb2, status_pb2
from polar.reconstructor.v1 import reconstructor_service_pb2 as pb

from polar_core.convert import completion_to_proto
from polar_core.errors import InvalidArgument
from polar_core.records import CompletionRecord
from reconstructor.app import service_defaults
from reconstructor.servicer import ReconstructorServicer
from reconstructor.settings import ReconstructorSettings


def rec(seq: int, prompt: list[int], response: list[int]) -> CompletionRecord:
    return CompletionRecord(
        session_id="s",
        call_id=f"c{seq}",
        seq=seq,
        prompt_token_ids=prompt,
        response_token_ids=response,
        response_logprobs=[-0.5] * len(response),
        parent_call_id="c0" if seq else None,
        extra={"backend": "scripted", "tool_call_parse_error": True},
    )


RECORDS = [rec(0, [1], [5, 9]), rec(1, [1, 5, 9, 7], [6, 9])]


class FakeSource:
    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    async def list_completions(self, proxy_target: str, session_id: str) -> list[CompletionRecord]:
        self.asked.append((proxy_target, session_id))
        return RECORDS


async def test_proxy_source_is_read_and_settings_fill_unspecified_fields():
    source = FakeSource()
    servicer = ReconstructorServicer(service_defaults(ReconstructorSettings(end_of_turn_ids=(9,))), source)
    request = pb.ReconstructRequest(
        proxy=pb.ProxySource(proxy_target="proxy:1", session_id="s"),
        terminal_status=status_pb2.TERMINAL_STATUS_AGENT_TIMEOUT,
        task_id="t",
    )
    reply = await servicer.Reconstruct(request, None)  # type: ignore[arg-type]
    assert source.asked == [("proxy:1", "s")]
    (trace,) = reply.traces
    assert list(trace.loss_mask) == [1, 1, 0, 1, 1]
    assert trace.status == "agent_timeout"
    assert trace.terminal_status == status_pb2.TERMINAL_STATUS_AGENT_TIMEOUT
    assert reply.stats.merges == 1


async def test_inline_completions_round_trip_through_protobuf():
    servicer = ReconstructorServicer(service_defaults(ReconstructorSettings()), FakeSource())
    request = pb.ReconstructRequest(
        completions=pb.CompletionList(completions=[completion_to_proto(r) for r in RECORDS]),
        end_of_turn_token_ids=[9],
        terminal_status=status_pb2.TERMINAL_STATUS_RESOLVED,
        weighting=pb.WEIGHTING_MODE_TRACE,
    )
    reply = await servicer.Reconstruct(request, None)  # type: ignore[arg-type]
    assert [list(t.call_ids) for t in reply.traces] == [["c0", "c1"]]
    assert reply.traces[0].weight == 1.0


async def test_unknown_enum_values_are_invalid_arguments():
    servicer = ReconstructorServicer(service_defaults(ReconstructorSettings()), FakeSource())
    completions = pb.CompletionList(completions=[completion_to_proto(RECORDS[0])])
    for request in (
        pb.ReconstructRequest(completions=completions, terminal_status=42),  # type: ignore[arg-type]
        pb.ReconstructRequest(completions=completions, terminal_status=1, strategy=42),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidArgument):
            await servicer.Reconstruct(request, None)  # type: ignore[arg-type]


async def _stream(*messages: pb.ReconstructStreamRequest) -> AsyncIterator[pb.ReconstructStreamRequest]:
    for message in messages:
        yield message


def _per_request_records(count: int) -> list[CompletionRecord]:
    return [rec(i, list(range(1, 200 + i)), [5, 9]) for i in range(count)]


async def test_reconstruct_stream_joins_completion_chunks_and_answers_in_chunks_under_the_budget():
    servicer = ReconstructorServicer(
        service_defaults(ReconstructorSettings()), FakeSource(), max_message_bytes=4 * 1024 * 1024
    )
    records = _per_request_records(12)
    request = pb.ReconstructRequest(
        completions=pb.CompletionList(completions=[completion_to_proto(records[0])]),
        strategy=reconstruction_pb2.RECONSTRUCTION_STRATEGY_PER_REQUEST,
        terminal_status=status_pb2.TERMINAL_STATUS_RESOLVED,
        task_id="t",
    )
    chunks = [
        pb.ReconstructStreamRequest(completions=pb.CompletionList(completions=[completion_to_proto(r) for r in part]))
        for part in (records[7:], records[1:7])  # out of order: sorted by seq
    ]
    servicer._chunk_bytes = 1000  # a few traces per message
    messages = _stream(pb.ReconstructStreamRequest(request=request), *chunks)
    replies = [r async for r in servicer.ReconstructStream(messages, None)]  # type: ignore[arg-type]
    assert len(replies) > 2
    assert all(r.ByteSize() <= 1000 for r in replies if len(r.traces) > 1)
    assert [r.HasField("stats") for r in replies] == [False] * (len(replies) - 1) + [True]
    traces = [t for r in replies for t in r.traces]
    assert [t.trace_index for t in traces] == list(range(12))
    assert [list(t.call_ids) for t in traces] == [[f"c{i}"] for i in range(12)]
    unary = await servicer.Reconstruct(
        pb.ReconstructRequest(
            completions=pb.CompletionList(completions=[completion_to_proto(r) for r in records]),
            strategy=reconstruction_pb2.RECONSTRUCTION_STRATEGY_PER_REQUEST,
            terminal_status=status_pb2.TERMINAL_STATUS_RESOLVED,
            task_id="t",
        ),
        None,  # type: ignore[arg-type]
    )
    assert list(unary.traces) == traces
    assert unary.stats == replies[-1].stats


async def test_reconstruct_stream_reads_a_proxy_source_and_refuses_a_malformed_stream():
    source = FakeSource()
    servicer = ReconstructorServicer(service_defaults(ReconstructorSettings(end_of_turn_ids=(9,))), source)
    proxy = pb.ReconstructRequest(
        proxy=pb.ProxySource(proxy_target="proxy:1", session_id="s"),
        terminal_status=status_pb2.TERMINAL_STATUS_RESOLVED,
    )
    messages = _stream(pb.ReconstructStreamRequest(request=proxy))
    replies = [r async for r in servicer.ReconstructStream(messages, None)]  # type: ignore[arg-type]
    assert source.asked == [("proxy:1", "s")]
    assert [len(r.traces) for r in replies] == [1]
    assert replies[0].stats.merges == 1
    chunk = pb.ReconstructStreamRequest(completions=pb.CompletionList(completions=[completion_to_proto(RECORDS[0])]))
    bad: list[list[pb.ReconstructStreamRequest]] = [[chunk], [pb.ReconstructStreamRequest(request=proxy), chunk], []]
    for parts in bad:
        with pytest.raises(InvalidArgument):
            _ = [r async for r in servicer.ReconstructStream(_stream(*parts), None)]  # type: ignore[arg-type]
