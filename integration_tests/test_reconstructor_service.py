"""The ReconstructorService over a real gRPC server: inline completions, proxy sources, error codes."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from polar.common.v1 import reconstruction_pb2, status_pb2
from polar.reconstructor.v1 import reconstructor_service_pb2 as pb
from polar.reconstructor.v1 import reconstructor_service_pb2_grpc as pb_grpc

from polar_core.channels import open_channel
from polar_core.convert import completion_to_proto
from polar_core.records import CompletionRecord, ReconstructionStrategy, TerminalStatus
from polar_run.serve import service_spec
from reconstructor import ReconstructionOptions, SessionOutcome, WeightingMode, reconstruct_session
from reconstructor.synthetic import IM_END, SyntheticSpec, synthetic_session


@pytest.fixture
async def stub(tmp_path: Path) -> AsyncIterator[pb_grpc.ReconstructorServiceStub]:
    spec = service_spec("reconstructor")
    server, port = await spec.start(spec.settings_cls.load(state_dir=tmp_path))
    try:
        async with open_channel(f"127.0.0.1:{port}") as channel:
            yield pb_grpc.ReconstructorServiceStub(channel)
    finally:
        await server.stop(None)


def _records() -> list[CompletionRecord]:
    spec = SyntheticSpec(turns=10, retokenize_prob=0.3, truncate_prob=0.2, compaction_every=4, subagents=2)
    return synthetic_session(random.Random(7), spec, "sess-1")


@pytest.mark.parametrize(
    ("strategy", "enum"),
    [
        (ReconstructionStrategy.PER_REQUEST, reconstruction_pb2.RECONSTRUCTION_STRATEGY_PER_REQUEST),
        (ReconstructionStrategy.PREFIX_MERGE, reconstruction_pb2.RECONSTRUCTION_STRATEGY_PREFIX_MERGE),
        (ReconstructionStrategy.EXACT, reconstruction_pb2.RECONSTRUCTION_STRATEGY_EXACT),
    ],
)
async def test_reconstruct_inline_matches_the_library(stub, strategy, enum):
    records = _records()
    request = pb.ReconstructRequest(
        completions=pb.CompletionList(completions=[completion_to_proto(r) for r in reversed(records)]),
        strategy=enum,
        end_of_turn_token_ids=[IM_END],
        task_id="task-1",
        reward=1.0,
        terminal_status=status_pb2.TERMINAL_STATUS_RESOLVED,
        weighting=pb.WEIGHTING_MODE_SESSION,
    )
    reply = await stub.Reconstruct(request, timeout=30)
    expected = reconstruct_session(
        records,
        ReconstructionOptions(strategy=strategy, end_of_turn_ids=(IM_END,), weighting=WeightingMode.SESSION),
        SessionOutcome(task_id="task-1", reward=1.0, status=TerminalStatus.RESOLVED),
    )
    assert len(reply.traces) == len(expected.traces) > 0
    for got, want in zip(reply.traces, expected.traces, strict=True):
        assert list(got.call_ids) == want.call_ids
        assert list(got.response_token_ids) == want.response_token_ids
        assert list(got.loss_mask) == want.loss_mask
        assert list(got.response_logprobs) == pytest.approx(want.response_logprobs)
        assert got.exact_context == want.exact_context
        assert got.terminal_status == status_pb2.TERMINAL_STATUS_RESOLVED
        assert got.status == "resolved"
    assert sum(t.weight for t in reply.traces) == pytest.approx(1.0)
    assert reply.stats.calls == len(records)
    assert reply.stats.chains == expected.stats.chains
    assert dict(reply.stats.splits_by_reason) == expected.stats.splits_by_reason
    assert reply.stats.mismatched_context_tokens == expected.stats.mismatched_context_tokens


async def test_unspecified_strategy_and_end_of_turn_use_defaults(stub):
    records = _records()
    request = pb.ReconstructRequest(
        completions=pb.CompletionList(completions=[completion_to_proto(r) for r in records]),
        terminal_status=status_pb2.TERMINAL_STATUS_UNRESOLVED,
    )
    reply = await stub.Reconstruct(request, timeout=30)
    expected = reconstruct_session(records, ReconstructionOptions(end_of_turn_ids=(IM_END,)))
    assert [list(t.call_ids) for t in reply.traces] == [t.call_ids for t in expected.traces]


async def _code(stub, request) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Reconstruct(request, timeout=30)
    return info.value.code()


async def test_bad_requests_are_invalid_arguments(stub):
    good = completion_to_proto(_records()[0])
    broken = completion_to_proto(_records()[0])
    broken.response_logprobs.append(-1.0)
    status = status_pb2.TERMINAL_STATUS_RESOLVED
    no_source = pb.ReconstructRequest(terminal_status=status)
    mismatched = pb.ReconstructRequest(completions=pb.CompletionList(completions=[broken]), terminal_status=status)
    no_status = pb.ReconstructRequest(completions=pb.CompletionList(completions=[good]))
    for request in (no_source, mismatched, no_status):
        assert await _code(stub, request) == grpc.StatusCode.INVALID_ARGUMENT


async def test_unreachable_proxy_is_unavailable(stub):
    request = pb.ReconstructRequest(
        proxy=pb.ProxySource(proxy_target="127.0.0.1:1", session_id="s"),
        terminal_status=status_pb2.TERMINAL_STATUS_RESOLVED,
    )
    assert await _code(stub, request) == grpc.StatusCode.UNAVAILABLE
