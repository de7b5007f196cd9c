"""The fleet's policy: register model proxies and move all of them to a new version together (UpdatePolicy).

Plain asyncio over two seams, the :class:`~rollout_server.store.Store` and a
:class:`~rollout_server.ports.ProxyClient`. An update runs in four steps:

1. **Decide** (under a lock, fast): validate, replay a stored outcome of the same version, refuse a version that
   is not above the current one, refuse while another version's update runs (a second call for the *same*
   version waits for the running one instead), refuse when no proxy is registered.
2. **Check** every proxy's ``CheckWeights`` concurrently (each backend compares the checkpoint's config and
   its tensors' names, shapes and dtypes with what it serves, from the file headers); any rejection, or a
   proxy that does not answer, ends the update with ``FailedPrecondition`` naming each proxy: nothing is
   paused and nothing is stored. (A proxy that an earlier update could not resume and that still does not
   answer does not block: it serves nothing, and it loads the current policy itself when it comes back.)
3. **Apply** per proxy, concurrently: pause (drain or abort), load the weights (the proxy loads them aside and
   sets the version only once they are in), resume. A proxy whose load fails anyway kept its previous weights
   and version, so it is *resumed* on them and named ``FAILED`` with its reason: no proxy ever serves the new
   version number with other weights, and none is left paused on a version it cannot load.
4. **Commit**: the new version becomes the fleet's current one (what :meth:`PolicyCoordinator.register_proxy`
   hands a starting proxy) at the first load that succeeds, before that proxy resumes. So a version no proxy
   could load is never stored: the update fails with ``FailedPrecondition`` naming each proxy's reason, every
   proxy serves its previous version again, and a proxy that restarts never loads it. Proxies that registered
   while the update ran (they read the previous version) are driven to the new one once it is committed.

Nothing is persisted before the commit because nothing would need resuming: a rollout server that stops
before it leaves nothing stored, and the trainer's next call for the version runs the update again (pause,
load and resume are idempotent on the proxy). Steps 2-4 run as one task shielded from the caller: a trainer
that disconnects mid-update and calls again with the same version gets the awaited (or stored) outcome.
Replaying an incomplete update of the current version first retries the proxies that failed; an update
interrupted by a restart of the rollout server after its commit is finished the same way.

**Weights the trainer synced itself** (``weights_synced``: verl, slime and other trainers that push weights into
their own inference servers, which the proxies use as backends): there is no checkpoint to check or load, so
step 2 is skipped and step 3 stamps the version (the proxy's ``SetPolicyVersion``) between pause and resume. The
stored policy has an empty weights path, and a proxy that starts later stamps the version without loading.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
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
        return current, list(await asyncio.gather(*(self._refresh(p, current.version) for p in stored)))

    async def _refresh(self, proxy: ProxyRecord, current: int) -> ProxyRecord:
        try:
            view = await self._proxies.get_policy(proxy.address)
        except PolarError as exc:
            return dataclasses.replace(proxy, error=proxy.error or f"unreachable: {exc.message}")
        # The error stays while it explains something: a proxy still paused, or serving an older version.
        behind = view.paused or view.policy_version < current
        return dataclasses.replace(
            proxy, version=view.policy_version, paused=view.paused, error=proxy.error if behind else ""
        )

    # Updates ----------------------------------------------------------------------------------------------
    async def update_policy(
        self,
        version: int,
        weights_path: str,
        *,
        pause_mode: PauseMode = PauseMode.DRAIN,
        drain_timeout_s: float | None = None,
        weights_synced: bool = False,
    ) -> UpdateOutcome:
        """Move every proxy to ``version`` served from ``weights_path`` (see the module docstring).

        With ``weights_synced`` the trainer has put the weights into the proxies' inference servers itself (its
        own servers, synced outside Polar): nothing is checked or loaded, each proxy is paused, stamps
        ``version`` and resumes, and the stored policy has an empty weights path (a proxy that starts later
        stamps the version alone). The work runs in a task of its own: cancelling this call does not stop the
        update.

        Raises:
            InvalidArgument: ``version`` below 1, an empty ``weights_path`` (or one given with ``weights_synced``)
                or a non-positive drain timeout.
            AlreadyExists: ``version`` was applied with other weights.
            FailedPrecondition: ``version`` is not above the current one, no proxy is registered, a proxy
                rejected the checkpoint (or did not answer) before anything was paused, or no proxy could load
                it (each was resumed on its previous version; nothing was stored).
            Aborted: Another version's update is in progress.
        """
        if version < 1:
            raise InvalidArgument(f"version must be at least 1, got {version}")
        if weights_synced and weights_path:
            raise InvalidArgument("weights_synced means the weights are already in the backends: give no weights_path")
        if not weights_path and not weights_synced:
            raise InvalidArgument("weights_path is required (or weights_synced, for weights the trainer synced itself)")
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
        if weights_path:  # synced weights (no path) are in the backends already: nothing to check
            await self._check(proxies, weights_path)
        policy = PolicyRecord(version, weights_path, self._clock())
        commit = _Commit(self._store, policy)
        outcomes = await self._drive(await self._store.list_proxies(), policy, mode, drain_s, commit)
        if not commit.done:
            reasons = "; ".join(f"{o.address} ({o.proxy_id}): {o.error}" for o in outcomes)
            _log.error("policy version %d loaded nowhere; nothing stored: %s", version, reasons)
            if not weights_path:
                raise FailedPrecondition(
                    f"no proxy could stamp synced policy version {version}; each is left paused (its backend "
                    f"holds the new weights) and nothing was stored; call again to retry: {reasons}"
                )
            raise FailedPrecondition(
                f"no proxy could load {weights_path!r} as policy version {version}; every proxy serves its "
                f"previous version again and nothing was stored: {reasons}"
            )
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
        commit = _Commit(self._store, stored.policy, done=True)
        retried = await self._drive(retry, stored.policy, mode, drain_s, commit, skip=proxies.values())
        outcome = await self._conclude(stored.policy, [*kept, *retried], started)
        return dataclasses.replace(outcome, replayed=True)

    async def _drive(
        self,
        targets: Sequence[ProxyRecord],
        policy: PolicyRecord,
        mode: PauseMode,
        drain_s: float,
        commit: _Commit,
        *,
        skip: Iterable[ProxyRecord] = (),
    ) -> list[ProxyOutcome]:
        """Apply ``policy`` to ``targets``, then to proxies that registered meanwhile; one outcome per proxy id.

        A proxy that registers before the commit reads the previous version and is in no batch yet, so once the
        version is committed the proxies are listed again until no new registration (id and address) appears.
        """
        seen = {(p.proxy_id, p.address) for p in [*targets, *skip]}
        outcomes: dict[str, ProxyOutcome] = {}
        batch = list(targets)
        while batch:
            for outcome in await asyncio.gather(*(self._apply(p, policy, mode, drain_s, commit) for p in batch)):
                outcomes[outcome.proxy_id] = outcome  # a proxy that came back at a new address: its last outcome
            if not commit.done:
                break
            batch = [p for p in await self._store.list_proxies() if (p.proxy_id, p.address) not in seen]
            seen.update((p.proxy_id, p.address) for p in batch)
        return list(outcomes.values())

    async def _conclude(self, policy: PolicyRecord, outcomes: Sequence[ProxyOutcome], started: float) -> UpdateOutcome:
        ordered = tuple(sorted(outcomes, key=lambda o: o.proxy_id))
        complete = all(o.state is ProxyUpdateState.UPDATED for o in ordered)
        outcome = UpdateOutcome(policy, ordered, complete, time.monotonic() - started)
        await self._store.set_policy_outcome(policy.version, outcome)
        failed = [f"{o.address} ({o.proxy_id}): {o.error}" for o in ordered if o.state is ProxyUpdateState.FAILED]
        if failed:
            _log.error(
                "policy version %d: %d of %d proxies failed (each serves its previous version, or is named "
                "as not resumed): %s",
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
                    return ""  # an earlier update could not resume it: it loads the stored policy when it returns
                return f"{proxy.address} ({proxy.proxy_id}) did not answer: {exc.message}"
            except PolarError as exc:
                return f"{proxy.address} ({proxy.proxy_id}) rejected {weights_path!r}: {exc.message}"
            return ""

        problems = [p for p in await asyncio.gather(*(one(p) for p in proxies)) if p]
        if problems:
            raise FailedPrecondition(
                "the checkpoint check failed; nothing was paused or stored: " + "; ".join(problems)
            )

    async def _apply(
        self, proxy: ProxyRecord, policy: PolicyRecord, mode: PauseMode, drain_s: float, commit: _Commit
    ) -> ProxyOutcome:
        address = proxy.address
        aborted = 0
        try:
            _, aborted = await self._proxies.pause(
                address, abort_in_flight=mode is PauseMode.ABORT, drain_timeout_s=drain_s
            )
            if policy.weights_path:
                load_s = await self._proxies.load_weights(address, policy.version, policy.weights_path)
            else:  # the trainer synced the weights into this proxy's backend: stamp the version only
                await self._proxies.set_policy_version(address, policy.version)
                load_s = 0.0
        except PolarError as exc:
            if not policy.weights_path:
                # Its backend serves the trainer's new weights already: resumed, it would stamp them with the old
                # version. It stays paused until a replay of this update (or the next one) stamps it.
                error = f"could not stamp synced policy version {policy.version}, left paused: {exc.message}"
                await self._store.set_proxy_state(proxy.proxy_id, version=None, paused=True, error=error)
                return ProxyOutcome(proxy.proxy_id, address, ProxyUpdateState.FAILED, error, aborted_calls=aborted)
            return await self._failed(proxy, exc.message, aborted, version=None)
        try:
            await commit()  # before the first proxy serves the new version, a proxy that starts loads it too
        except PolarError as exc:
            return await self._failed(proxy, exc.message, aborted, version=policy.version)
        try:
            await self._proxies.resume(address)
        except PolarError as exc:
            error = f"loaded policy version {policy.version} but could not be resumed: {exc.message}"
            await self._store.set_proxy_state(proxy.proxy_id, version=policy.version, paused=True, error=error)
            return ProxyOutcome(proxy.proxy_id, address, ProxyUpdateState.FAILED, error, load_s, aborted)
        await self._store.set_proxy_state(proxy.proxy_id, version=policy.version, paused=False, error="")
        return ProxyOutcome(proxy.proxy_id, address, ProxyUpdateState.UPDATED, "", load_s, aborted)

    async def _failed(self, proxy: ProxyRecord, error: str, aborted: int, *, version: int | None) -> ProxyOutcome:
        """Resume a proxy whose update failed: a failed load left it on its previous weights and version."""
        paused = False
        try:
            await self._proxies.resume(proxy.address)
        except PolarError as exc:
            paused = True
            error = f"{error}; it could not be resumed either: {exc.message}"
        await self._store.set_proxy_state(proxy.proxy_id, version=version, paused=paused, error=error)
        return ProxyOutcome(proxy.proxy_id, proxy.address, ProxyUpdateState.FAILED, error, aborted_calls=aborted)

    async def close(self) -> None:
        """Wait for an update in progress to finish (it is never cut halfway)."""
        tasks = list(self._tasks)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


class _Commit:
    """Stores an update's version as the fleet's current one, once, when the first proxy has loaded it.

    Args:
        store: The store.
        policy: The version and weights.
        done: Already stored (the replay of a committed update).
    """

    def __init__(self, store: Store, policy: PolicyRecord, *, done: bool = False) -> None:
        self._store = store
        self._policy = policy
        self._lock = asyncio.Lock()
        self.done = done

    async def __call__(self) -> None:
        """Store the version unless it is stored already.

        Raises:
            FailedPrecondition: A version at or above it was stored meanwhile (another rollout server).
        """
        async with self._lock:
            if self.done:
                return
            if not await self._store.insert_policy(self._policy):
                raise FailedPrecondition(
                    f"policy version {self._policy.version} is not above the stored current version"
                )
            self.done = True
            _log.info("policy version %d stored (%s)", self._policy.version, self._policy.weights_path)


def _log_failure(task: asyncio.Task[UpdateOutcome]) -> None:
    if not task.cancelled() and task.exception() is not None:
        exc = task.exception()
        if not isinstance(exc, PolarError):
            _log.error("policy update task failed", exc_info=exc)
