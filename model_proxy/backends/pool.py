"""Several replicas of one backend behind one :class:`~model_proxy.ports.Backend`.

Routing: a call with an ``affinity_key`` (the session id) goes to the replica that a consistent-hash ring
(rendezvous hashing) picks for that key, so a session's calls share one server's prefix cache; replicas added
or removed move only their share of sessions. When that replica is unhealthy (it failed its last health
check or its last call with ``BackendUnavailable``), the next replica in the key's ranking takes the call.
Calls without a key go to the healthy replica with the fewest calls in flight.

Only failures before the first chunk fail over: once a replica has streamed tokens, its error is raised, since
the tokens already sampled cannot be taken back.

Weight updates check the checkpoint on every replica before any replica loads it. When a load still fails on
some replicas after others loaded it, the pool serves the new weights from those that did and takes the others
out of rotation until a later load reaches them, so no call is sampled from weights other than the version the
proxy stamps.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import AsyncIterator, Sequence

from model_proxy.errors import BackendUnavailable
from model_proxy.models import GenerationChunk, GenerationRequest
from model_proxy.ports import Backend
from polar_core.errors import FailedPrecondition, PolarError

__all__ = ["BackendPool"]

_log = logging.getLogger(__name__)


def _weight(key: str, index: int) -> int:
    digest = hashlib.blake2b(f"{key}\x00{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class BackendPool:
    """Load-balances calls over replicas with session affinity.

    Attributes:
        name: The replicas' kind name (``vllm``, ``triton``, ...).
    """

    def __init__(self, replicas: Sequence[Backend], *, unhealthy_retry_s: float = 5.0) -> None:
        """Create the pool.

        Args:
            replicas: One backend per server; all of one kind.
            unhealthy_retry_s: How long a replica that failed stays out of rotation before it is tried again.

        Raises:
            ValueError: No replica.
        """
        if not replicas:
            raise ValueError("a backend pool needs at least one replica")
        self._replicas = list(replicas)
        self.name = self._replicas[0].name
        self._in_flight = [0] * len(self._replicas)
        self._down_until = [0.0] * len(self._replicas)
        self._retry_s = unhealthy_retry_s
        self._stale: set[int] = set()  # replicas on other weights than the rest: never called

    @property
    def replicas(self) -> list[Backend]:
        """The replicas, in configuration order."""
        return list(self._replicas)

    @property
    def in_flight(self) -> list[int]:
        """Calls in flight per replica."""
        return list(self._in_flight)

    def _up(self, index: int) -> bool:
        return time.monotonic() >= self._down_until[index]

    def _mark_down(self, index: int) -> None:
        self._down_until[index] = time.monotonic() + self._retry_s

    def ranking(self, affinity_key: str) -> list[int]:
        """Return replica indices in the order a call with this key tries them (healthy ones first)."""
        indices = range(len(self._replicas))
        if affinity_key:
            order = sorted(indices, key=lambda i: _weight(affinity_key, i), reverse=True)
        else:
            order = sorted(indices, key=lambda i: self._in_flight[i])
        order = [i for i in order if i not in self._stale]
        return [i for i in order if self._up(i)] + [i for i in order if not self._up(i)]

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Send the call to the chosen replica, failing over while nothing has been streamed.

        Raises:
            BackendUnavailable: Every replica failed with ``BackendUnavailable``.
            Exception: Any other error of the chosen replica (overload, timeout, bad request) as is.
        """
        last: BackendUnavailable | None = None
        for index in self.ranking(request.affinity_key):
            replica = self._replicas[index]
            self._in_flight[index] += 1
            started = False
            try:
                async for chunk in replica.generate(request):
                    started = True
                    yield chunk
                return
            except BackendUnavailable as exc:
                self._mark_down(index)
                if started:
                    raise
                last = exc
            finally:
                self._in_flight[index] -= 1
        assert last is not None
        raise BackendUnavailable(
            f"all {len(self._replicas)} {self.name} replicas are unavailable; last: {last.message}",
            retry_after_s=last.retry_after_s,
        ) from last

    async def start(self) -> None:
        """Start every replica."""
        for replica in self._replicas:
            await replica.start()

    async def close(self) -> None:
        """Close every replica."""
        for replica in self._replicas:
            await replica.close()

    async def check_weights(self, path: str) -> str:
        """Check the checkpoint on every replica; return the first one's architecture."""
        names = [await replica.check_weights(path) for replica in self._replicas]
        return names[0]

    async def load_weights(self, path: str) -> None:
        """Check the checkpoint on every replica, then load it into each, one after another.

        A replica whose load fails after another's succeeded leaves rotation until a later load reaches it.

        Raises:
            FailedPrecondition: A replica refused the checkpoint (nothing was loaded), or every load failed.
        """
        for replica in self._replicas:
            await replica.check_weights(path)
        failed: dict[int, PolarError] = {}
        for index, replica in enumerate(self._replicas):
            try:
                await replica.load_weights(path)
            except PolarError as exc:
                failed[index] = exc
        reasons = "; ".join(f"replica {i}: {exc.message}" for i, exc in failed.items())
        if len(failed) == len(self._replicas):
            raise FailedPrecondition(f"no {self.name} replica loaded {path!r}: {reasons}")
        self._stale = set(failed)
        if failed:
            _log.error(
                "%d of %d replicas failed to load %s and leave rotation: %s",
                len(failed),
                len(self._replicas),
                path,
                reasons,
            )

    async def healthy(self) -> bool:
        """Check every replica (updating rotation); true when at least one is healthy."""
        any_up = False
        for index, replica in enumerate(self._replicas):
            if index not in self._stale and await replica.healthy():
                self._down_until[index] = 0.0
                any_up = True
            else:
                self._mark_down(index)
        return any_up
