"""The gRPC :class:`~rollout_server.ports.ProxyClient`: ModelProxyService's policy RPCs, one channel per address."""

from __future__ import annotations

import grpc
from opentelemetry.sdk.trace import TracerProvider
from polar.proxy.v1 import model_proxy_service_pb2 as pb
from polar.proxy.v1 import model_proxy_service_pb2_grpc as pb_grpc

from polar_core.channels import open_channel
from polar_core.durations import duration
from polar_core.rpc_client import rpc
from polar_core.tls import TlsFiles
from rollout_server.ports import ProxyPolicyView

__all__ = ["GrpcProxyClient"]

# Extra time a PauseGeneration call gets on top of the drain it asks for.
_PAUSE_SLACK_S = 10.0


class GrpcProxyClient:
    """Calls ModelProxyService's policy RPCs.

    Args:
        auth_token: The control-plane token.
        timeout_s: Deadline of the short calls (check, resume, get).
        load_timeout_s: Deadline of LoadWeights (a large checkpoint takes minutes).
        tracer_provider: Provider for client spans.
        tls: mTLS files, when mTLS is on.
    """

    def __init__(
        self,
        *,
        auth_token: str = "",
        timeout_s: float = 10.0,
        load_timeout_s: float = 600.0,
        tracer_provider: TracerProvider | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        self._token = auth_token
        self._timeout = timeout_s
        self._load_timeout = load_timeout_s
        self._tracer_provider = tracer_provider
        self._tls = tls
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, pb_grpc.ModelProxyServiceAsyncStub] = {}

    def _stub(self, address: str) -> pb_grpc.ModelProxyServiceAsyncStub:
        stub = self._stubs.get(address)
        if stub is None:
            channel = open_channel(
                address, tracer_provider=self._tracer_provider, auth_token=self._token, tls=self._tls
            )
            self._channels[address] = channel
            stub = self._stubs[address] = pb_grpc.ModelProxyServiceStub(channel)
        return stub

    async def check_weights(self, address: str, weights_path: str) -> str:
        """Call CheckWeights; return the checkpoint's architecture."""
        reply = await rpc(
            self._stub(address).CheckWeights(pb.CheckWeightsRequest(weights_path=weights_path), timeout=self._timeout),
            address,
        )
        return reply.architecture

    async def pause(self, address: str, *, abort_in_flight: bool, drain_timeout_s: float) -> tuple[int, int]:
        """Call PauseGeneration with the drain limit; return (in flight, aborted)."""
        request = pb.PauseGenerationRequest(abort_in_flight=abort_in_flight, drain_timeout=duration(drain_timeout_s))
        call = self._stub(address).PauseGeneration(request, timeout=drain_timeout_s + _PAUSE_SLACK_S)
        reply = await rpc(call, address)
        return reply.in_flight, reply.aborted

    async def load_weights(self, address: str, policy_version: str, weights_path: str) -> float:
        """Call LoadWeights; return the backend's load seconds."""
        request = pb.LoadWeightsRequest(policy_version=policy_version, weights_path=weights_path)
        reply = await rpc(self._stub(address).LoadWeights(request, timeout=self._load_timeout), address)
        return reply.load_seconds

    async def resume(self, address: str) -> int:
        """Call ResumeGeneration; return the released calls."""
        reply = await rpc(
            self._stub(address).ResumeGeneration(pb.ResumeGenerationRequest(), timeout=self._timeout), address
        )
        return reply.released

    async def get_policy(self, address: str) -> ProxyPolicyView:
        """Call GetPolicy."""
        reply = await rpc(self._stub(address).GetPolicy(pb.GetPolicyRequest(), timeout=self._timeout), address)
        return ProxyPolicyView(reply.policy_version, reply.weights_path, reply.paused, reply.in_flight)

    async def close(self) -> None:
        """Close every channel."""
        for channel in self._channels.values():
            await channel.close(None)
        self._channels.clear()
        self._stubs.clear()
