"""The gRPC :class:`~model_proxy.fleet_membership.Registrar`: RegisterProxy on the rollout server."""

from __future__ import annotations

import grpc
from opentelemetry.sdk.trace import TracerProvider
from polar.rollout.v1 import rollout_service_pb2 as pb
from polar.rollout.v1 import rollout_service_pb2_grpc as pb_grpc

from model_proxy.fleet_membership import FleetPolicy
from polar_core.channels import open_channel
from polar_core.rpc_client import rpc
from polar_core.tls import TlsFiles
from polar_core.version import polar_version

__all__ = ["GrpcRolloutRegistrar"]


class GrpcRolloutRegistrar:
    """Calls RolloutService.RegisterProxy over one channel.

    Args:
        target: ``host:port`` of the RolloutService.
        auth_token: The control-plane token.
        timeout_s: Deadline of each call.
        tracer_provider: Provider for client spans.
        tls: mTLS files, when mTLS is on.
    """

    def __init__(
        self,
        target: str,
        *,
        auth_token: str = "",
        timeout_s: float = 10.0,
        tracer_provider: TracerProvider | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        self._target = target
        self._channel: grpc.aio.Channel = open_channel(
            target, tracer_provider=tracer_provider, auth_token=auth_token, tls=tls
        )
        self._stub: pb_grpc.RolloutServiceAsyncStub = pb_grpc.RolloutServiceStub(self._channel)
        self._timeout = timeout_s

    async def register(self, proxy_id: str, address: str, backend: str) -> FleetPolicy:
        """Call RegisterProxy."""
        request = pb.RegisterProxyRequest(proxy_id=proxy_id, address=address, backend=backend, version=polar_version())
        reply = await rpc(self._stub.RegisterProxy(request, timeout=self._timeout), self._target)
        return FleetPolicy(reply.policy.version, reply.policy.weights_path)

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close(None)
