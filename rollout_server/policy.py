"""The fleet's policy: register model proxies and move all of them to a new version together (UpdatePolicy).

Plain asyncio over two seams, the :class:`~rollout_server.store.Store` and a
:class:`~rollout_server.ports.ProxyClient`. An update runs in four steps:

1. **Decide** (under a lock, fast): validate, replay a stored outcome of the same version, refuse a version that
   is not above the current one, refuse while another version's update runs (a second call for the *same*
   version waits for the running one instead), refuse when no proxy is registered.
2. **Check** every proxy's ``CheckWeights`` concurrently; any rejection, or a proxy that does not answer, ends
   the update with ``FailedPrecondition`` naming each proxy: nothing is paused and nothing is stored. (A proxy
   that an earlier update left paused and that still does not answer does not block: it serves nothing, and it
   loads the current policy itself when it comes back.)
3. **Persist** the new version as current *before* pausing anything, so a proxy that starts from now on loads
   it itself (:meth:`PolicyCoordinator.register_proxy` hands it out).
4. **Apply** per proxy, concurrently: pause (drain or abort), load the weights (the proxy sets the version only
   once they are loaded), resume. A proxy that fails is *not* resumed: it stays paused and is named with its
   reason, so no proxy ever serves the new version number with other weights.

Steps 2-4 run as one task shielded from the caller: a trainer that disconnects mid-update and calls again with
the same version gets the awaited (or stored) outcome. Replaying an incomplete update of the current version
first retries the proxies that failed; an update interrupted by a restart of the rollout server is finished the
same way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from polar_core.errors import (
    Aborted,
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    PolarError,
    Unavailable,
)
from polar_core.version import check_same_version
from rollout_server.models import (
    PauseMode,
    PolicyConfig,
    PolicyRecord,
    PolicyUpdateRecord,
    ProxyOutcome,
    ProxyRecord,
    ProxyUpdateState,
    UpdateOutcome,
)
from rollout_server.ports import ProxyClient
from rollout_server.store.base import Store

__all__ = ["PolicyCoordinator"]

_log = logging.getLogger(__name__)
_UNREACHABLE = (Unavailable, DeadlineExceeded)


@dataclasses.dataclass(frozen=True, slots=True)
class _Running:
    version: int
    weights_path: str
    task: asyncio.Task[UpdateOutcome]


class PolicyCoordinator:
    """Knows the fleet's proxies and moves them to new policy versions.

    Args:
        store: Where the policy, the update outcomes and the proxies persist.
        proxies: Calls to the proxies.
        config: Limits.
        clock: Unix seconds (tests pass a fake).
    """

    def __init__(
        self,
        store: Store,
        proxies: ProxyClient,
        config: PolicyConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._proxies = proxies
        self._config = config or PolicyConfig()
        self._clock = clock
        self._lock = asyncio.Lock()
        self._running: _Running | None = None
        self._tasks: set[asyncio.Task[UpdateOutcome]] = set()

    # Registration and reads -----------------------------------------------------------------------------
    async def register_proxy(self, proxy_id: str, address: str, backend: str, version: str = "") -> PolicyRecord:
        """Add or refresh a proxy and return the policy it must load before it admits a call (version 0: none).

        The proxy is stored first and the policy read after, so a proxy registering while an update persists a
        new version either is among the proxies that update drives or reads the new version here.

        Raises:
            InvalidArgument: A missing id or address.
            FailedPrecondition: The proxy runs another Polar release than this server.
        """
        if not proxy_id:
            raise InvalidArgument("proxy_id is required")
        if not address:
            raise InvalidArgument("address is required")
        check_same_version(f"proxy {proxy_id}", version, self._config.server_version)
        await self._store.upsert_proxy(ProxyRecord(proxy_id, address, backend, registered_at=self._clock()))
        current = await self.current_policy()
        _log.info("proxy %s registered at %s (%s); fleet version %d", proxy_id, address, backend, current.version)
        return current

    async def current_policy(self) -> PolicyRecord:
        """The fleet's current policy (version 0 before the first update)."""
        return await self._store.current_policy() or PolicyRecord(0, "")

    async def get_policy(self) -> tuple[PolicyRecord, list[ProxyRecord]]:
        """The current policy and every proxy, each refreshed from its own answer when it gives one."""
        current = await self.current_policy()
        stored = await self._store.list_proxies()
        return current, list(await asyncio.gather(*(self._refresh(p) for p in stored)))

    async def _refresh(self, proxy: ProxyRecord) -> ProxyRecord:
        try:
            view = await self._proxies.get_policy(proxy.address)
        except PolarError as exc:
            return dataclasses.replace(proxy, error=proxy.error or f"unreachable: {exc.message}")
        return dataclasses.replace(
            proxy, version=view.policy_version, paused=view.paused, error=proxy.error if view.paused else ""
        )

    # Updates ----------------------------------------------------------------------------------------------
    async def update_policy(
        self,
        version: int,
        weights_path: str,
        *,
        pause_mode: PauseMode = PauseMode.DRAIN,
        drain_timeout_s: float | None = None,
    ) -> UpdateOutcome:
        """Move every proxy to ``version`` served from ``weights_path`` (see the module docstring).

        The work runs in a task of its own: cancelling this call does not stop the update.

        Raises:
            InvalidArgument: ``version`` below 1, an empty ``weights_path`` or a non-positive drain timeout.
            AlreadyExists: ``version`` was applied with other weights.
            FailedPrecondition: ``version`` is not above the current one, no proxy is registered, or a proxy
                rejected the checkpoint (or did not answer) before anything was paused.
            Aborted: Another version's update is in progress.
        """
        if version < 1:
            raise InvalidArgument(f"version must be at least 1, got {version}")
        if not weights_path:
            raise InvalidArgument("weights_path is required")
        if drain_timeout_s is not None and drain_timeout_s <= 0:
            raise InvalidArgument("drain_timeout must be positive")
        drain = drain_timeout_s if drain_timeout_s is not None else self._config.drain_timeout_s
        async with self._lock:
            running = self._running
            if running is not None and not running.task.done():
                if running.version != version or running.weights_path != weights_path:
                    raise Aborted(
                        f"the update to policy version {running.version} is in progress; retry when it has finished"
                    )
                task, joined = running.task, True
            else:
                decided = await self._decide(version, weights_path, pause_mode, drain)
                if isinstance(decided, UpdateOutcome):
                    return decided
                task, joined = decided, False
        outcome = await asyncio.shield(task)
        return dataclasses.replace(outcome, replayed=True) if joined else outcome

    async def _decide(
        self, version: int, weights_path: str, mode: PauseMode, drain_s: float
    ) -> UpdateOutcome | asyncio.Task[UpdateOutcome]:
        stored = await self._store.get_policy_update(version)
        current = await self.current_policy()
        if stored is not None:
            if stored.policy.weights_path != weights_path:
                raise AlreadyExists(
                    f"policy version {version} was applied with weights {stored.policy.weights_path!r}, "
                    f"not {weights_path!r}"
                )
            finished = stored.outcome is not None and stored.outcome.complete
            if finished or version != current.version:
                # An incomplete update of a superseded version is not retried: it would move proxies backwards.
                return self._stored_outcome(stored)
            return self._spawn(version, weights_path, self._finish(stored, mode, drain_s))
        if version <= current.version:
            raise FailedPrecondition(f"policy version {version} is not above the current version {current.version}")
        proxies = await self._store.list_proxies()
        if not proxies:
            raise FailedPrecondition("no model proxy is registered; start proxies with rollout_address set")
        return self._spawn(version, weights_path, self._update(version, weights_path, proxies, mode, drain_s))

    def _stored_outcome(self, stored: PolicyUpdateRecord) -> UpdateOutcome:
        if stored.outcome is None:  # only when a superseded update was interrupted
            return UpdateOutcome(stored.policy, (), complete=False, seconds=0.0, replayed=True)
        return dataclasses.replace(stored.outcome, replayed=True)

    def _spawn(
        self, version: int, weights_path: str, work: Coroutine[Any, Any, UpdateOutcome]
    ) -> asyncio.Task[UpdateOutcome]:
        task = asyncio.create_task(work, name=f"policy-update-{version}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_log_failure)
        self._running = _Running(version, weights_path, task)
        return task

    async def _update(
        self, version: int, weights_path: str, proxies: Sequence[ProxyRecord], mode: PauseMode, drain_s: float
    ) -> UpdateOutcome:
        started = time.monotonic()
        await self._check(proxies, weights_path)
        policy = PolicyRecord(version, weights_path, self._clock())
        if not await self._store.insert_policy(policy):
            raise FailedPrecondition(f"policy version {version} is not above the stored current version")
        _log.info("policy version %d stored (%s); updating the fleet", version, weights_path)
        targets = await self._store.list_proxies()  # read after persisting: late registrations are included
        outcomes = await asyncio.gather(*(self._apply(p, policy, mode, drain_s) for p in targets))
        return await self._conclude(policy, outcomes, started)

    async def _finish(self, stored: PolicyUpdateRecord, mode: PauseMode, drain_s: float) -> UpdateOutcome:
        started = time.monotonic()
        proxies = {p.proxy_id: p for p in await self._store.list_proxies()}
        kept: list[ProxyOutcome] = []
        retry: list[ProxyRecord] = list(proxies.values())
        if stored.outcome is not None:
            kept = [o for o in stored.outcome.proxies if o.state is ProxyUpdateState.UPDATED]
            done = {o.proxy_id for o in kept}
            retry = [p for p in proxies.values() if p.proxy_id not in done]
        retried = await asyncio.gather(*(self._apply(p, stored.policy, mode, drain_s) for p in retry))
        outcome = await self._conclude(stored.policy, [*kept, *retried], started)
        return dataclasses.replace(outcome, replayed=True)

    async def _conclude(self, policy: PolicyRecord, outcomes: Sequence[ProxyOutcome], started: float) -> UpdateOutcome:
        ordered = tuple(sorted(outcomes, key=lambda o: o.proxy_id))
        complete = all(o.state is ProxyUpdateState.UPDATED for o in ordered)
        outcome = UpdateOutcome(policy, ordered, complete, time.monotonic() - started)
        await self._store.set_policy_outcome(policy.version, outcome)
        failed = [f"{o.address} ({o.proxy_id}): {o.error}" for o in ordered if o.state is ProxyUpdateState.FAILED]
        if failed:
            _log.error(
                "policy version %d: %d of %d proxies failed and stay paused: %s",
                policy.version,
                len(failed),
                len(ordered),
                "; ".join(failed),
            )
        else:
            _log.info("policy version %d: %d proxies updated (%.2f s)", policy.version, len(ordered), outcome.seconds)
        return outcome

    async def _check(self, proxies: Sequence[ProxyRecord], weights_path: str) -> None:
        async def one(proxy: ProxyRecord) -> str:
            try:
                await self._proxies.check_weights(proxy.address, weights_path)
            except _UNREACHABLE as exc:
                if proxy.paused:
                    return ""  # left paused by an earlier update: it loads the stored policy when it returns
                return f"{proxy.address} ({proxy.proxy_id}) did not answer: {exc.message}"
            except PolarError as exc:
                return f"{proxy.address} ({proxy.proxy_id}) rejected {weights_path!r}: {exc.message}"
            return ""

        problems = [p for p in await asyncio.gather(*(one(p) for p in proxies)) if p]
        if problems:
            raise FailedPrecondition(
                "the checkpoint check failed; nothing was paused or stored: " + "; ".join(problems)
            )

    async def _apply(self, proxy: ProxyRecord, policy: PolicyRecord, mode: PauseMode, drain_s: float) -> ProxyOutcome:
        address = proxy.address
        aborted = 0
        try:
            _, aborted = await self._proxies.pause(
                address, abort_in_flight=mode is PauseMode.ABORT, drain_timeout_s=drain_s
            )
            load_s = await self._proxies.load_weights(address, policy.version, policy.weights_path)
            await self._proxies.resume(address)
        except PolarError as exc:
            error = exc.message
            await self._store.set_proxy_state(proxy.proxy_id, version=None, paused=True, error=error)
            return ProxyOutcome(proxy.proxy_id, address, ProxyUpdateState.FAILED, error, aborted_calls=aborted)
        await self._store.set_proxy_state(proxy.proxy_id, version=policy.version, paused=False, error="")
        return ProxyOutcome(proxy.proxy_id, address, ProxyUpdateState.UPDATED, "", load_s, aborted)

    async def close(self) -> None:
        """Wait for an update in progress to finish (it is never cut halfway)."""
        tasks = list(self._tasks)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


def _log_failure(task: asyncio.Task[UpdateOutcome]) -> None:
    if not task.cancelled() and task.exception() is not None:
        exc = task.exception()
        if not isinstance(exc, PolarError):
            _log.error("policy update task failed", exc_info=exc)
