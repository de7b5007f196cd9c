"""The proxy's side of a policy update: check a checkpoint, load it while paused, report what is served.

:class:`WeightManager` sits between the ModelProxyService's ``CheckWeights``/``LoadWeights``/``GetPolicy`` and
the backend. The policy version changes only after the backend has loaded the weights, so a call stamped with
a version was always sampled from that version's weights; a failed load leaves both the weights and the
version as they were (and the proxy paused).
"""

from __future__ import annotations

import asyncio
import logging
import time

from model_proxy.core import ProxyEngine
from model_proxy.models import ServedPolicy
from model_proxy.ports import Backend
from polar_core.errors import FailedPrecondition, InvalidArgument

__all__ = ["WeightManager"]

_log = logging.getLogger(__name__)


class WeightManager:
    """Checks and loads checkpoints into one engine's backend.

    Args:
        engine: The proxy's engine (its gate and policy version).
        backend: The engine's backend.
    """

    def __init__(self, engine: ProxyEngine, backend: Backend) -> None:
        self._engine = engine
        self._backend = backend
        self._lock = asyncio.Lock()
        self.weights_path = ""

    def served(self) -> ServedPolicy:
        """The version and weights served, and the gate's state."""
        gate = self._engine.gate
        return ServedPolicy(self._engine.policy_version, self.weights_path, gate.paused, gate.in_flight)

    @property
    def version_number(self) -> int:
        """The served version as an integer (0 when it is not a decimal number)."""
        version = self._engine.policy_version
        return int(version) if version.isdecimal() else 0

    async def check(self, weights_path: str) -> str:
        """Check a checkpoint without touching the served model; return its architecture.

        Raises:
            InvalidArgument: An empty path.
            FailedPrecondition: The backend rejects the checkpoint (the message says why) or cannot load weights.
        """
        if not weights_path:
            raise InvalidArgument("weights_path is required")
        return await self._backend.check_weights(weights_path)

    async def load(self, policy_version: str, weights_path: str) -> tuple[str, float]:
        """Load ``weights_path`` and then serve it as ``policy_version``; generation must be paused.

        Loading what is already served returns at once (load seconds 0).

        Returns:
            (the version served before, the backend's load seconds).

        Raises:
            InvalidArgument: An empty version or path.
            FailedPrecondition: Generation is not paused, or the backend rejected or failed the load.
        """
        if not policy_version:
            raise InvalidArgument("policy_version is required")
        if not weights_path:
            raise InvalidArgument("weights_path is required")
        async with self._lock:
            previous = self._engine.policy_version
            if (previous, self.weights_path) == (policy_version, weights_path):
                return previous, 0.0
            if not self._engine.gate.paused:
                raise FailedPrecondition("generation is not paused; call PauseGeneration before LoadWeights")
            started = time.monotonic()
            await self._backend.load_weights(weights_path)
            seconds = time.monotonic() - started
            self._engine.policy_version = policy_version
            self.weights_path = weights_path
        _log.info("loaded %s as policy version %s in %.2f s (was %s)", weights_path, policy_version, seconds, previous)
        return previous, seconds
