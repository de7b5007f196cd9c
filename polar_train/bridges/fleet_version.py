"""Stamp a policy version on the whole fleet for weights a trainer synced into its own inference servers.

verl and slime push new weights into their own vLLM/SGLang servers (NCCL or CUDA IPC), which the proxies use as
backends, so there is no checkpoint for Polar to load. After such a sync the trainer calls
:func:`stamp_fleet_version`: the rollout server's ``UpdatePolicy`` with ``weights_synced`` pauses every proxy
(calls in flight drain), stamps the version on the calls each records from then on, resumes it, and stores the
version, so ``GetPolicy``, ``max_policy_lag`` and ``stale_policy`` measure lag against it and a proxy that starts
later takes it. A proxy that cannot be stamped is left paused (its backend already serves the new weights) and
named; calling again with the same version retries it.
"""

from __future__ import annotations

from typing import Literal, Protocol

from polar_client import PolicyUpdateResult, RolloutClient

__all__ = ["FleetStampIncomplete", "PolicyUpdater", "stamp_fleet_version", "stamp_with"]


class FleetStampIncomplete(RuntimeError):
    """Some proxy was not stamped (the message names each one and why; it stays paused)."""


class PolicyUpdater(Protocol):
    """The part of :class:`polar_client.RolloutClient` the stamp uses."""

    async def update_policy(
        self,
        version: int,
        weights_path: str = "",
        *,
        pause_mode: Literal["drain", "abort"] = "drain",
        drain_timeout_s: float | None = None,
        timeout_s: float | None = None,
        weights_synced: bool = False,
    ) -> PolicyUpdateResult: ...


async def stamp_with(
    client: PolicyUpdater, version: int, *, pause_mode: Literal["drain", "abort"] = "drain"
) -> PolicyUpdateResult:
    """Stamp ``version`` on every proxy through ``client``; see the module docstring.

    Raises:
        FleetStampIncomplete: A proxy was not stamped.
        grpc.aio.AioRpcError: The rollout server refused (a version not above the current one, no proxy, ...).
    """
    result = await client.update_policy(version, weights_synced=True, pause_mode=pause_mode)
    if not result.complete:
        failed = "; ".join(f"{p.address} ({p.proxy_id}): {p.error}" for p in result.proxies if not p.updated)
        raise FleetStampIncomplete(f"policy version {version} was not stamped everywhere: {failed}")
    return result


async def stamp_fleet_version(
    rollout_address: str,
    version: int,
    *,
    token: str = "",
    pause_mode: Literal["drain", "abort"] = "drain",
    timeout_s: float = 60.0,
) -> PolicyUpdateResult:
    """Stamp ``version`` on every proxy of the fleet served by the rollout server at ``rollout_address``.

    Raises:
        FleetStampIncomplete: A proxy was not stamped.
        grpc.aio.AioRpcError: The rollout server refused or did not answer.
    """
    async with RolloutClient(rollout_address, token=token, timeout_s=timeout_s) as client:
        return await stamp_with(client, version, pause_mode=pause_mode)
