"""A stand-in for ``UpdatePolicy`` while the rollout server cannot move the fleet yet (tests only).

TO BE REPLACED by :class:`polar_train.loop.RolloutUpdater` once ``UpdatePolicy``/``LoadWeights`` land
(branch p13-fleet): it moves the one proxy of an embedded stack by hand, in this process, the way the
rollout server will: ``PauseGeneration`` (drain) over gRPC, load the checkpoint into a new model object and
swap it into the proxy's transformers backend, ``SetPolicyVersion(str(version))``, ``ResumeGeneration``.
The backend is found by wrapping ``model_proxy.policy.make_backend`` while the stack starts
(:func:`capture_backends`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from polar.proxy.v1 import model_proxy_service_pb2 as proxy_pb
from polar.proxy.v1 import model_proxy_service_pb2_grpc as proxy_grpc

from polar_core.channels import open_channel

__all__ = ["EmbeddedProxySwap", "capture_backends"]


@contextlib.contextmanager
def capture_backends() -> Iterator[list[Any]]:
    """Collect every backend ``model_proxy.policy.make_backend`` creates inside the block."""
    import model_proxy.policy as policy

    created: list[Any] = []
    original = policy.make_backend

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        backend = original(*args, **kwargs)
        created.append(backend)
        return backend

    policy.make_backend = wrapped
    try:
        yield created
    finally:
        policy.make_backend = original


class EmbeddedProxySwap:
    """Moves the embedded proxy to a new checkpoint by hand (see the module docstring).

    Args:
        proxy_address: The proxy's gRPC address.
        token: The control-plane token.
        backend: The proxy's ``TransformersBackend``.
    """

    def __init__(self, proxy_address: str, token: str, backend: Any) -> None:
        self._channel = open_channel(proxy_address, auth_token=token)
        self._stub = proxy_grpc.ModelProxyServiceStub(self._channel)
        self._backend = backend
        self.versions: list[int] = []

    async def current_version(self) -> int:
        """The last version this stand-in set (0 before the first update)."""
        return self.versions[-1] if self.versions else 0

    async def update(self, version: int, weights_path: Path) -> None:
        """Pause (drain), swap the weights, set the version, resume."""
        from transformers import AutoModelForCausalLM

        model: Any = await asyncio.to_thread(AutoModelForCausalLM.from_pretrained, str(weights_path))
        model.train(False)
        await self._stub.PauseGeneration(proxy_pb.PauseGenerationRequest(abort_in_flight=False), timeout=120)
        try:
            async with self._backend._lock:  # no generation runs while the model object is replaced
                self._backend._model = model
            await self._stub.SetPolicyVersion(proxy_pb.SetPolicyVersionRequest(policy_version=str(version)), timeout=30)
        finally:
            await self._stub.ResumeGeneration(proxy_pb.ResumeGenerationRequest(), timeout=30)
        self.versions.append(version)

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close(None)
