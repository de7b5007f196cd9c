"""Every service starts on port 0, answers health checks, maps errors precisely and enforces the token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from polar.gateway.v1 import gateway_service_pb2, gateway_service_pb2_grpc

from polar_core.channels import open_channel
from polar_core.errors import InvalidArgument, ResourceExhausted
from polar_core.server import ServiceRegistration, start_grpc_server
from polar_run.serve import SERVICE_NAMES, service_spec


@pytest.mark.parametrize("name", SERVICE_NAMES)
async def test_service_serves_health_on_port_zero(name: str, tmp_path: Path) -> None:
    spec = service_spec(name)
    # The proxy's embedded default loads SmolLM2 (about 20 s); the tiny fixture model starts in a second.
    extra: dict[str, Any] = {"model": "tiny"} if name == "proxy" else {}
    settings = spec.settings_cls.load(state_dir=tmp_path, **extra)
    server, port = await spec.start(settings)
    try:
        assert port > 0
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for service in ("", spec.grpc_service):
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop(None)


class _FailingGateway(gateway_service_pb2_grpc.GatewayServiceServicer):
    async def GetCapacity(self, request, context):  # type: ignore[no-untyped-def]
        raise ResourceExhausted("postrun queue is full", retry_after_s=2.5, details={"stage": "POSTRUN"})

    async def GetSession(self, request, context):  # type: ignore[no-untyped-def]
        if not request.session_id:
            raise InvalidArgument("session_id is required")
        raise RuntimeError("secret internal detail")

    async def WatchSessions(self, request, context):  # type: ignore[no-untyped-def]
        yield gateway_service_pb2.WatchSessionsResponse()
        raise InvalidArgument("stream broke on purpose")


async def _start_failing(token: str = "") -> tuple[grpc.aio.Server, int]:
    servicer = _FailingGateway()  # type: ignore[abstract]
    return await start_grpc_server(
        [
            ServiceRegistration(
                "polar.gateway.v1.GatewayService",
                lambda s: gateway_service_pb2_grpc.add_GatewayServiceServicer_to_server(servicer, s),
            )
        ],
        host="127.0.0.1",
        port=0,
        auth_token=token,
    )


async def test_errors_map_to_precise_status_codes_with_details() -> None:
    server, port = await _start_failing()
    try:
        async with open_channel(f"127.0.0.1:{port}") as channel:
            stub = gateway_service_pb2_grpc.GatewayServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.GetCapacity(gateway_service_pb2.GetCapacityRequest(), timeout=5)
            err = info.value
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert err.details() == "postrun queue is full"
            metadata: Any = err.trailing_metadata() or ()
            raw = dict(metadata)["grpc-status-details-bin"]
            status = status_pb2.Status.FromString(raw)
            infos = [error_details_pb2.ErrorInfo(), error_details_pb2.RetryInfo()]
            assert status.details[0].Unpack(infos[0])
            assert status.details[1].Unpack(infos[1])
            assert infos[0].reason == "ResourceExhausted"
            assert infos[0].metadata["stage"] == "POSTRUN"
            assert infos[1].retry_delay.ToNanoseconds() == 2_500_000_000

            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.GetSession(gateway_service_pb2.GetSessionRequest(), timeout=5)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT

            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.GetSession(gateway_service_pb2.GetSessionRequest(session_id="x"), timeout=5)
            assert info.value.code() == grpc.StatusCode.INTERNAL
            assert "secret internal detail" not in (info.value.details() or "")

            call = stub.WatchSessions(gateway_service_pb2.WatchSessionsRequest(), timeout=5)
            received: list[Any] = []

            async def drain() -> None:
                async for item in call:
                    received.append(item)

            with pytest.raises(grpc.aio.AioRpcError) as info:
                await drain()
            assert len(received) == 1
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await server.stop(None)


async def test_unknown_task_is_not_found(tmp_path: Path) -> None:
    from polar.rollout.v1 import rollout_service_pb2, rollout_service_pb2_grpc

    spec = service_spec("rollout")
    server, port = await spec.start(spec.settings_cls.load(state_dir=tmp_path))
    try:
        async with open_channel(f"127.0.0.1:{port}") as channel:
            stub = rollout_service_pb2_grpc.RolloutServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.GetTask(rollout_service_pb2.GetTaskRequest(task_id="t"), timeout=5)
    finally:
        await server.stop(None)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_calls_without_the_control_plane_token_are_refused() -> None:
    server, port = await _start_failing(token="s3cret")
    try:
        async with open_channel(f"127.0.0.1:{port}") as channel:
            stub = gateway_service_pb2_grpc.GatewayServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.GetCapacity(gateway_service_pb2.GetCapacityRequest(), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        async with open_channel(f"127.0.0.1:{port}", auth_token="wrong") as channel:
            stub = gateway_service_pb2_grpc.GatewayServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.GetCapacity(gateway_service_pb2.GetCapacityRequest(), timeout=5)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        async with open_channel(f"127.0.0.1:{port}", auth_token="s3cret") as channel:
            stub = gateway_service_pb2_grpc.GatewayServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.GetCapacity(gateway_service_pb2.GetCapacityRequest(), timeout=5)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            # Server-streaming calls carry the token too (the servicer yields once, then fails on purpose).
            call = stub.WatchSessions(gateway_service_pb2.WatchSessionsRequest(), timeout=5)
            first = await call.read()
            assert isinstance(first, gateway_service_pb2.WatchSessionsResponse)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call.read()
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await server.stop(None)
