from __future__ import annotations

import pytest
from polar.common.v1 import status_pb2
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
