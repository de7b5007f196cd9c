from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from polar.common.v1 import status_pb2
from polar.reconstructor.v1 import reconstructor_service_pb2 as pb
from polar.reconstructor.v1 import reconstructor_service_pb2_grpc as pb_grpc

from polar_core.channels import open_channel
from polar_core.errors import DeadlineExceeded, Internal, NotFound, Unavailable
from polar_core.records import CompletionRecord
from reconstructor.proxy_source import _error_from_rpc
from reconstructor.server import start_server
from reconstructor.settings import ReconstructorSettings


class OneCallSource:
    async def list_completions(self, proxy_target: str, session_id: str) -> list[CompletionRecord]:
        return [
            CompletionRecord(session_id=session_id, call_id="c0", seq=0, prompt_token_ids=[1],
                             response_token_ids=[5, 9], response_logprobs=[-0.5, -0.5])
        ]  # fmt: skip


def _rpc_error(code: grpc.StatusCode, details: str = "boom") -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, None)


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (grpc.StatusCode.NOT_FOUND, NotFound),
        (grpc.StatusCode.UNAVAILABLE, Unavailable),
        (grpc.StatusCode.DEADLINE_EXCEEDED, DeadlineExceeded),
        (grpc.StatusCode.INVALID_ARGUMENT, Internal),
        (grpc.StatusCode.PERMISSION_DENIED, Internal),
    ],
)
def test_proxy_statuses_are_passed_on_or_stay_internal(code: grpc.StatusCode, expected: type[Exception]) -> None:
    error = _error_from_rpc(_rpc_error(code), "proxy:1", "s")
    assert type(error) is expected
    assert error.details == {"proxy_target": "proxy:1", "session_id": "s"}
    if expected is Internal:
        assert error.message == f"model proxy proxy:1 answered {code.name}"
    else:
        assert error.message == "model proxy proxy:1: boom"


async def test_start_server_serves_the_apps_completion_source(tmp_path: Path) -> None:
    source = OneCallSource()
    settings = ReconstructorSettings(state_dir=tmp_path, end_of_turn_ids=(9,))
    running = await start_server(settings, completion_source=source)
    try:
        assert running.app.completion_source is source
        assert running.app.defaults.end_of_turn_ids == (9,)
        async with open_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.ReconstructorServiceStub(channel)
            request = pb.ReconstructRequest(
                proxy=pb.ProxySource(proxy_target="p", session_id="s"),
                terminal_status=status_pb2.TERMINAL_STATUS_RESOLVED,
            )
            reply = await stub.Reconstruct(request, timeout=30)
        assert [list(t.call_ids) for t in reply.traces] == [["c0"]]
    finally:
        await running.stop(None)
