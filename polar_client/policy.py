"""Typed results of :meth:`polar_client.RolloutClient.update_policy`."""

from __future__ import annotations

import dataclasses
from typing import Literal

from polar.rollout.v1 import rollout_service_pb2 as pb

__all__ = ["PauseModeName", "PolicyUpdateResult", "ProxyUpdateResult", "pause_mode_to_proto"]

PauseModeName = Literal["drain", "abort"]

_MODES = {"drain": pb.PAUSE_MODE_DRAIN, "abort": pb.PAUSE_MODE_ABORT}


def pause_mode_to_proto(mode: PauseModeName) -> pb.PauseMode:
    """The PauseMode enum value of ``"drain"`` or ``"abort"``.

    Raises:
        ValueError: Any other name.
    """
    if mode not in _MODES:
        raise ValueError(f"pause_mode must be 'drain' or 'abort', got {mode!r}")
    return _MODES[mode]


@dataclasses.dataclass(frozen=True, slots=True)
class ProxyUpdateResult:
    """One proxy's part in an update.

    Attributes:
        proxy_id: The proxy.
        address: Its gRPC address.
        updated: Whether it serves the new policy (otherwise it was resumed on its previous weights, or stays paused
            only when it could not be reached; see ``error``).
        error: Why it failed; empty when updated.
        load_seconds: Seconds its backend took to load the weights.
        aborted_calls: In-flight calls the pause aborted (``pause_mode="abort"``).
    """

    proxy_id: str
    address: str
    updated: bool
    error: str
    load_seconds: float
    aborted_calls: int


@dataclasses.dataclass(frozen=True, slots=True)
class PolicyUpdateResult:
    """The outcome of an UpdatePolicy call.

    Attributes:
        version: The fleet's policy version after the update.
        weights_path: Its checkpoint directory.
        complete: Whether every proxy serves it.
        replayed: Whether an earlier call with the same version and weights stored this outcome.
        seconds: Seconds from the first checkpoint check to the last resume.
        proxies: Every proxy's part, by proxy id.
    """

    version: int
    weights_path: str
    complete: bool
    replayed: bool
    seconds: float
    proxies: tuple[ProxyUpdateResult, ...]

    @property
    def failed(self) -> tuple[ProxyUpdateResult, ...]:
        """The proxies that failed (paused, named with their reason)."""
        return tuple(p for p in self.proxies if not p.updated)

    @classmethod
    def from_proto(cls, reply: pb.UpdatePolicyResponse) -> PolicyUpdateResult:
        """Read an UpdatePolicyResponse."""
        return cls(
            version=reply.policy.version,
            weights_path=reply.policy.weights_path,
            complete=reply.complete,
            replayed=reply.replayed,
            seconds=reply.seconds,
            proxies=tuple(
                ProxyUpdateResult(
                    proxy_id=p.proxy_id,
                    address=p.address,
                    updated=p.state == pb.PROXY_UPDATE_STATE_UPDATED,
                    error=p.error,
                    load_seconds=p.load_seconds,
                    aborted_calls=p.aborted_calls,
                )
                for p in reply.proxies
            ),
        )
