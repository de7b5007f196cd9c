"""Long sessions carry: 60-call sessions growing past 32k tokens through the real stack, and a task of them read back.

The embedded stack runs the real rollout server, gateway, model proxy (tiny byte-level tokenizer, scripted
backend), reconstructor and evaluator, each over gRPC; the agent is a command harness making chat calls with
the OpenAI SDK and appending each reply and a 2.5 kB tool output to its context. A session's completions and
its per-request traces are each well past gRPC's default 4 MiB limit, so this only passes with the raised
limit (``max_message_bytes``) and ListCompletions paging by size. The 16-sample task uses 20-call sessions
(the same growth per call): each session's per-request traces are ~0.55 MB, so the task's results (~9 MB)
are still over 4 MiB for one GetTask while the test stays within a couple of minutes on two cores.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
from pathlib import Path

import grpc
import pytest
from polar.common.v1 import session_pb2, trace_pb2
from polar.rollout.v1 import rollout_service_pb2 as pb
from polar.rollout.v1 import rollout_service_pb2_grpc

from integration_tests.support.long_sessions import long_task, stack_options
from polar_client import RolloutClient
from polar_core.auth import bearer_metadata
from polar_run.embedded import EmbeddedStack

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for the workspace"),
]

CALLS = 60
TOOL_BYTES = 2500
TASK_CALLS = 20
SAMPLES = 16
GRPC_DEFAULT_LIMIT = 4 * 1024 * 1024


def _tokens(trace: trace_pb2.Trace) -> list[int]:
    return [*trace.prompt_token_ids, *trace.response_token_ids]


async def _run(client: RolloutClient, task_id: str, strategy: str) -> session_pb2.SessionResult:
    reply = await client.submit(long_task(task_id, calls=CALLS, tool_bytes=TOOL_BYTES, strategy=strategy))
    await client.wait(reply.task_id, poll_s=0.5)
    got = await client.get(reply.task_id)
    assert len(got.session_results) == 1
    return got.session_results[0]


def _check_long_sessions(results: dict[str, session_pb2.SessionResult]) -> None:
    for strategy, result in results.items():
        assert result.status == "resolved", (strategy, result.error_message)
        assert result.statistics.completions == CALLS, strategy
    per_request = results["per_request"].traces
    assert len(per_request) == CALLS
    assert len(per_request[-1].prompt_token_ids) > 32_768  # the context grew past 32k tokens
    assert sum(t.ByteSize() for t in per_request) > GRPC_DEFAULT_LIMIT  # the point: past gRPC's default limit
    for earlier, later in itertools.pairwise(per_request):
        # Each call's prompt extends the previous call's prompt and reply (the agent appends to its context).
        assert list(later.prompt_token_ids[: len(_tokens(earlier))]) == _tokens(earlier)
        assert len(earlier.response_logprobs) == len(earlier.response_token_ids)
    sampled = sum(len(t.response_token_ids) for t in per_request)
    for strategy in ("prefix_merge", "exact"):
        traces = results[strategy].traces
        assert len(traces) == 1, strategy  # one chain: every call extends the last
        merged = traces[0]
        assert _tokens(merged) == _tokens(per_request[-1]), strategy
        assert sum(merged.loss_mask) == sampled, strategy
        assert len(merged.call_ids) == CALLS, strategy
    assert results["exact"].traces[0].exact_context


async def _check_task(client: RolloutClient, stack: EmbeddedStack, task_id: str) -> None:
    full = await client.get(task_id)
    assert len(full.session_results) == SAMPLES
    outcomes = [(r.session_id, r.status, len(r.traces), r.error_message) for r in full.session_results]
    assert all(status == "resolved" and traces == TASK_CALLS for _, status, traces, _ in outcomes), outcomes
    assert full.ByteSize() > GRPC_DEFAULT_LIMIT  # one GetTask of every trace needs the raised limit
    assert full.next_result_index == 0

    budget = 3 * 1024 * 1024
    paged = [r async for r in client.results(task_id, max_page_bytes=budget)]
    assert [r.session_id for r in paged] == [r.session_id for r in full.session_results]
    assert [len(r.traces) for r in paged] == [len(r.traces) for r in full.session_results]
    first = await client.get(task_id, max_page_bytes=budget)
    assert 0 < len(first.session_results) < SAMPLES
    assert first.next_result_index == len(first.session_results)

    bare = await client.get(task_id, omit_traces=True)
    assert len(bare.session_results) == SAMPLES
    assert not any(r.traces for r in bare.session_results)
    assert all(r.statistics.completions == TASK_CALLS for r in bare.session_results)

    watched = [r async for r in client.watch(task_id)]
    assert sorted(r.session_id for r in watched) == sorted(r.session_id for r in full.session_results)
    assert all(len(r.traces) == TASK_CALLS for r in watched)
    watched_bare = [r async for r in client.watch(task_id, omit_traces=True)]
    assert len(watched_bare) == SAMPLES
    assert not any(r.traces for r in watched_bare)

    # A client on gRPC's default 4 MiB limit cannot take the whole task at once, but can page through it.
    metadata = bearer_metadata(stack.token)
    async with grpc.aio.insecure_channel(stack.rollout_address) as channel:
        stub = rollout_service_pb2_grpc.RolloutServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.GetTask(pb.GetTaskRequest(task_id=task_id), metadata=metadata, timeout=60)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        page = await stub.GetTask(
            pb.GetTaskRequest(task_id=task_id, max_page_bytes=budget), metadata=metadata, timeout=60
        )
        assert page.session_results
        assert page.next_result_index


@pytest.mark.timeout(900)
async def test_long_sessions_carry(tmp_path: Path) -> None:
    options = stack_options(tmp_path / "state", tmp_path / "script.jsonl", calls=CALLS, tool_bytes=TOOL_BYTES)
    async with (
        EmbeddedStack.start(options) as stack,
        RolloutClient(stack.rollout_address, token=stack.token, timeout_s=120) as client,
    ):
        strategies = ("per_request", "prefix_merge", "exact")
        done = await asyncio.gather(*(_run(client, f"long-{s}", s) for s in strategies))
        _check_long_sessions(dict(zip(strategies, done, strict=True)))

        reply = await client.submit(long_task("long-task", calls=TASK_CALLS, tool_bytes=TOOL_BYTES, samples=SAMPLES))
        await client.wait(reply.task_id, poll_s=0.5)
        await _check_task(client, stack, reply.task_id)


SMALL_LIMIT = 4 * 1024 * 1024  # the smallest max_message_bytes a service accepts
SMALL_LIMIT_TOOL_BYTES = 7000  # a 60-call session's result (per-request traces) is then ~3x SMALL_LIMIT
_SERVICE_PREFIXES = ("POLAR_PROXY_", "POLAR_GATEWAY_", "POLAR_ROLLOUT_", "POLAR_RECONSTRUCTOR_", "POLAR_EVALUATOR_")


@pytest.mark.timeout(600)
async def test_a_long_session_carries_with_every_service_at_the_smallest_message_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every server and channel at 4 MiB, and a session whose completions and traces are several times that:
    only the size-paged and streamed paths (ListCompletions pages, ReconstructStream,
    ReportSessionResultStream, GetTask's trace cursor, WatchTask's split results) carry it."""
    for prefix in _SERVICE_PREFIXES:
        monkeypatch.setenv(f"{prefix}MAX_MESSAGE_BYTES", str(SMALL_LIMIT))
    script = tmp_path / "script.jsonl"
    options = stack_options(tmp_path / "state", script, calls=CALLS, tool_bytes=SMALL_LIMIT_TOOL_BYTES)
    async with (
        EmbeddedStack.start(options) as stack,
        RolloutClient(stack.rollout_address, token=stack.token, timeout_s=120, max_message_bytes=SMALL_LIMIT) as client,
    ):
        reply = await client.submit(long_task("small-limit", calls=CALLS, tool_bytes=SMALL_LIMIT_TOOL_BYTES))
        await client.wait(reply.task_id, poll_s=0.5)
        (result,) = [r async for r in client.results(reply.task_id)]
        assert result.status == "resolved", result.error_message
        assert result.statistics.completions == CALLS
        assert [t.trace_index for t in result.traces] == list(range(CALLS))
        assert len(result.traces[-1].prompt_token_ids) > 32_768
        assert result.ByteSize() > 2.5 * SMALL_LIMIT  # several messages' worth, in one session's result

        (watched,) = [r async for r in client.watch(reply.task_id)]
        assert watched == result

        # The limit is in force: the result in one message is refused, by the server's send limit.
        metadata = bearer_metadata(stack.token)
        async with grpc.aio.insecure_channel(
            stack.rollout_address, options=[("grpc.max_receive_message_length", 64 * SMALL_LIMIT)]
        ) as channel:
            stub = rollout_service_pb2_grpc.RolloutServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.GetTask(pb.GetTaskRequest(task_id=reply.task_id), metadata=metadata, timeout=60)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
