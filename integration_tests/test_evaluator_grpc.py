"""The EvaluatorService over a real gRPC server: prepare, evaluate the reference fix, idempotent re-evaluation."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from google.protobuf import struct_pb2
from polar.common.v1 import status_pb2, task_pb2
from polar.evaluator.v1 import evaluator_service_pb2 as pb
from polar.evaluator.v1 import evaluator_service_pb2_grpc as pb_grpc

from evaluator.server import create_server
from evaluator.settings import EvaluatorSettings
from integration_tests.support.evaluator import example_spec
from polar_core.channels import open_channel


def _spec_proto(name: str) -> tuple[task_pb2.EvaluatorSpec, bytes]:
    spec, fix = example_spec(name)
    options = struct_pb2.Struct()
    options.update({k: (str(v) if isinstance(v, Path) else v) for k, v in spec.options.items()})
    return task_pb2.EvaluatorSpec(strategy=spec.strategy, options=options), fix


@pytest.mark.parametrize("patch_kind", ["reference", "garbage"])
async def test_evaluate_over_grpc(tmp_path: Path, patch_kind: str) -> None:
    server, port = await create_server(EvaluatorSettings(state_dir=tmp_path))
    try:
        async with open_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.EvaluatorServiceStub(channel)
            spec, fix = _spec_proto("paginate")
            prepared = await stub.Prepare(pb.PrepareRequest(evaluator=spec, task_id="paginate", request_id="r1"))
            again = await stub.Prepare(pb.PrepareRequest(evaluator=spec, task_id="paginate", request_id="r1"))
            assert prepared.handle
            assert again.handle == prepared.handle
            patch = fix if patch_kind == "reference" else b"this is not a patch\n"
            request = pb.EvaluateRequest(
                handle=prepared.handle,
                artifacts=pb.EvaluationArtifacts(patch_bytes=patch, agent_status=pb.AGENT_STATUS_COMPLETED),
            )
            first = await stub.Evaluate(request, timeout=90)
            second = await stub.Evaluate(request, timeout=90)
            if patch_kind == "reference":
                assert first.terminal_status == status_pb2.TERMINAL_STATUS_RESOLVED
                assert first.reward == 1.0
                assert first.test_outcomes
                assert all(t.outcome == pb.TEST_OUTCOME_STATUS_PASSED for t in first.test_outcomes)
            else:
                assert first.terminal_status == status_pb2.TERMINAL_STATUS_INVALID_PATCH
                assert first.reward == 0.0
            assert second == first
            assert await asyncio.to_thread(Path(first.log_ref).exists)
            released = await stub.Release(pb.ReleaseRequest(handle=prepared.handle))
            assert released.released
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.Evaluate(pb.EvaluateRequest(handle="no-such-handle"), timeout=10)
            assert info.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await server.stop(None)
