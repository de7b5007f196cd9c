"""The proxy's side of a policy update: check a checkpoint, load it while paused, report what is served.

:class:`WeightManager` sits between the ModelProxyService's ``CheckWeights``/``LoadWeights``/``SetPolicyVersion``/
``GetPolicy`` and the backend, and is the only writer of the version the engine stamps on calls. The policy
version changes only after the backend has loaded the weights, so a call stamped with a version was always
sampled from that version's weights; a failed load leaves both the weights and the version as they were (every
backend loads aside and swaps on success, or checks the checkpoint's headers before it touches the server), so
the rollout server resumes the proxy on them. ``SetPolicyVersion`` (weights synced into the backend outside
Polar) takes the same lock, so it never interleaves with a load, and so does a starting proxy's
:meth:`WeightManager.join`. Versions are numbers here (:mod:`polar_core.policy_version`); the engine stamps
their wire form.
"""

from __future__ import annotations

import asyncio
import logging
import time

from model_proxy.core import ProxyEngine
from model_proxy.models import ServedPolicy
from model_proxy.ports import Backend
from polar_core.errors import FailedPrecondition, InvalidArgument
from polar_core.policy_version import format_version, parse_version

__all__ = ["WeightManager"]

_log = logging.getLogger(__name__)


class WeightManager:
    """Checks and loads checkpoints into one engine's backend, and keeps the version it stamps.

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
        """The served version as a number (a configured label is the initial policy, 0)."""
        return parse_version(self._engine.policy_version)

    async def check(self, weights_path: str) -> str:
        """Check a checkpoint without touching the served model; return its architecture.

        Raises:
            InvalidArgument: An empty path.
            FailedPrecondition: The backend rejects the checkpoint (the message says why) or cannot load weights.
        """
        if not weights_path:
            raise InvalidArgument("weights_path is required")
        return await self._backend.check_weights(weights_path)

    async def load(self, version: int, weights_path: str) -> tuple[str, float]:
        """Load ``weights_path`` and then serve it as ``version``; generation must be paused.

        Loading what is already served returns at once (load seconds 0).

        Returns:
            (the version stamped before, in its wire form, the backend's load seconds).

        Raises:
            InvalidArgument: A negative version or an empty path.
            FailedPrecondition: Generation is not paused, or the backend rejected or failed the load.
        """
        stamp = _stamp(version)
        if not weights_path:
            raise InvalidArgument("weights_path is required")
        async with self._lock:
            return await self._load(stamp, weights_path)

    async def _load(self, stamp: str, weights_path: str) -> tuple[str, float]:
        previous = self._engine.policy_version
        if (previous, self.weights_path) == (stamp, weights_path):
            return previous, 0.0
        if not self._engine.gate.paused:
            raise FailedPrecondition("generation is not paused; call PauseGeneration before LoadWeights")
        started = time.monotonic()
        await self._backend.load_weights(weights_path)
        seconds = time.monotonic() - started
        self._engine.policy_version = stamp
        self.weights_path = weights_path
        _log.info("loaded %s as policy version %s in %.2f s (was %s)", weights_path, stamp, seconds, previous)
        return previous, seconds

    async def join(self, version: int, weights_path: str) -> None:
        """Serve the fleet's policy, unless a newer one is served already, and then open the gate (a starting proxy).

        Both happen under the load lock, so an update's LoadWeights never runs with the gate opened under it.

        Raises:
            InvalidArgument: A negative version.
            FailedPrecondition: The backend refused or failed the load (the gate stays shut).

        A version above 0 with an empty path is a fleet policy whose weights the trainer synced into the inference
        servers itself (``UpdatePolicy`` with ``weights_synced``): it is stamped without a load.
        """
        stamp = _stamp(version)
        async with self._lock:
            if version > 0 and self.version_number < version:
                if weights_path:
                    await self._load(stamp, weights_path)
                else:
                    self._engine.policy_version = stamp
                    _log.info("policy version %s taken from the fleet without a load (weights synced)", stamp)
            self._engine.gate.resume()

    async def set_version(self, version: int) -> str:
        """Stamp ``version`` on new calls without loading anything (the weights were synced outside Polar).

        It waits for a load in progress, so the version never changes under one. The weights path stays the last
        one loaded. Setting the version already stamped changes nothing.

        Returns:
            The version stamped before, in its wire form.

        Raises:
            InvalidArgument: A negative version.
        """
        stamp = _stamp(version)
        async with self._lock:
            previous = self._engine.policy_version
            self._engine.policy_version = stamp
        if previous != stamp:
            _log.info("policy version set to %s without a load (was %s)", stamp, previous)
        return previous


def _stamp(version: int) -> str:
    try:
        return format_version(version)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from exc
