"""One fleet, one Polar release: the real rollout server refuses a gateway or a proxy that registers with another
version (FAILED_PRECONDITION naming both) and accepts its own version."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from polar.rollout.v1 import rollout_service_pb2 as pb
from polar.rollout.v1 import rollout_service_pb2_grpc as pb_grpc

from polar_core.channels import open_channel
from polar_core.version import polar_version
from rollout_server.server import create_server
from rollout_server.settings import RolloutSettings

OTHER = "0.0.1" if polar_version() != "0.0.1" else "0.0.2"


@pytest.mark.skipif(not polar_version(), reason="polar-rollout is not installed (scripts/setup.sh)")
async def test_roles_of_another_release_are_refused_naming_both_versions(tmp_path: Path) -> None:
    server, port = await create_server(RolloutSettings(state_dir=tmp_path / "state"))
    try:
        async with open_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.RolloutServiceStub(channel)
            gateway = pb.RegisterGatewayRequest(gateway_id="g", address="127.0.0.1:1", capacity=1, version=OTHER)
            proxy = pb.RegisterProxyRequest(proxy_id="p", address="127.0.0.1:2", backend="scripted", version=OTHER)
            for call, request in (("RegisterGateway", gateway), ("RegisterProxy", proxy)):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await getattr(stub, call)(request, timeout=10)
                assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert f"runs Polar {OTHER} but this rollout server runs Polar {polar_version()}" in str(
                    refused.value.details()
                )
            # Nothing was registered by the refused calls; the same roles at this release are accepted.
            listed = await stub.ListGateways(pb.ListGatewaysRequest(), timeout=10)
            assert [g.gateway_id for g in listed.gateways] == []
            await stub.RegisterGateway(
                pb.RegisterGatewayRequest(gateway_id="g", address="127.0.0.1:1", capacity=1, version=polar_version()),
                timeout=10,
            )
            await stub.RegisterProxy(
                pb.RegisterProxyRequest(
                    proxy_id="p", address="127.0.0.1:2", backend="scripted", version=polar_version()
                ),
                timeout=10,
            )
            listed = await stub.ListGateways(pb.ListGatewaysRequest(), timeout=10)
            assert [(g.gateway_id, g.version) for g in listed.gateways] == [("g", polar_version())]
    finally:
        await server.stop(None)
