"""Unit tests of the policy coordinator: registration, UpdatePolicy's every status, failures, replay, concurrency.

No ports: SQLite in a temporary file and in-memory fake proxies.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from polar_core.errors import Aborted, AlreadyExists, FailedPrecondition, InvalidArgument
from rollout_server.models import PauseMode, PolicyConfig, PolicyRecord, ProxyUpdateState
from rollout_server.policy import PolicyCoordinator
from rollout_server.store.sql import SqlStore
from rollout_server.store.sqlite import open_sqlite_store
from rollout_server.testing.fake_proxies import FakeProxyClient


@dataclasses.dataclass
class Env:
    store: SqlStore
    fleet: FakeProxyClient
    coordinator: PolicyCoordinator
    path: Path

    async def add(self, *names: str) -> None:
        for name in names:
            self.fleet.add(f"addr-{name}")
            await self.coordinator.register_proxy(name, f"addr-{name}", "scripted")

    async def reopen(self) -> PolicyCoordinator:
        await self.coordinator.close()
        await self.store.close()
        self.store = await open_sqlite_store(self.path)
        self.coordinator = PolicyCoordinator(self.store, self.fleet, PolicyConfig(drain_timeout_s=5))
        return self.coordinator


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    path = tmp_path / "rollout.sqlite3"
    store = await open_sqlite_store(path)
    fleet = FakeProxyClient()
    e = Env(store, fleet, PolicyCoordinator(store, fleet, PolicyConfig(drain_timeout_s=5)), path)
    yield e
    await e.coordinator.close()
    await e.store.close()


async def test_register_returns_the_current_policy_and_refuses_missing_fields(env: Env) -> None:
    env.fleet.add("addr-a")
    policy = await env.coordinator.register_proxy("a", "addr-a", "scripted")
    assert policy.version == 0
    with pytest.raises(InvalidArgument, match="proxy_id"):
        await env.coordinator.register_proxy("", "addr-a", "scripted")
    with pytest.raises(InvalidArgument, match="address"):
        await env.coordinator.register_proxy("b", "", "scripted")
    await env.coordinator.update_policy(1, "/ckpt/v1")
    assert (await env.coordinator.register_proxy("c", "addr-c", "vllm")).version == 1


async def test_invalid_arguments_and_no_proxy(env: Env) -> None:
    with pytest.raises(InvalidArgument, match="at least 1"):
        await env.coordinator.update_policy(0, "/ckpt")
    with pytest.raises(InvalidArgument, match="weights_path"):
        await env.coordinator.update_policy(1, "")
    with pytest.raises(InvalidArgument, match="drain_timeout"):
        await env.coordinator.update_policy(1, "/ckpt", drain_timeout_s=0)
    with pytest.raises(FailedPrecondition, match="no model proxy"):
        await env.coordinator.update_policy(1, "/ckpt")
    assert await env.store.current_policy() is None


async def test_update_moves_every_proxy_and_get_policy_shows_it(env: Env) -> None:
    await env.add("b", "a")
    outcome = await env.coordinator.update_policy(1, "/ckpt/v1", pause_mode=PauseMode.ABORT)
    assert outcome.complete
    assert not outcome.replayed
    assert outcome.policy.version == 1
    assert outcome.policy.weights_path == "/ckpt/v1"
    assert [p.proxy_id for p in outcome.proxies] == ["a", "b"]
    assert all(p.state is ProxyUpdateState.UPDATED and p.load_seconds == 0.25 for p in outcome.proxies)
    for name in ("a", "b"):
        proxy = env.fleet.proxies[f"addr-{name}"]
        assert (proxy.policy_version, proxy.weights_path, proxy.paused) == ("1", "/ckpt/v1", False)
        # Checked before anything was paused, loaded while paused, then resumed.
        assert [c for a, c in env.fleet.calls if a == f"addr-{name}"] == ["check", "pause", "load", "resume"]
    policy, proxies = await env.coordinator.get_policy()
    assert policy.version == 1
    assert policy.updated_at > 0
    assert [(p.proxy_id, p.version, p.paused, p.error) for p in proxies] == [("a", 1, False, ""), ("b", 1, False, "")]


async def test_a_rejected_checkpoint_pauses_nothing_and_stores_nothing(env: Env) -> None:
    await env.add("a", "b")
    env.fleet.proxies["addr-b"].reject_check = "no config.json in /ckpt/v1"
    with pytest.raises(FailedPrecondition, match=r"addr-b \(b\) rejected '/ckpt/v1': .*no config.json"):
        await env.coordinator.update_policy(1, "/ckpt/v1")
    assert {c for _, c in env.fleet.calls} == {"check"}
    assert await env.store.current_policy() is None
    assert await env.store.get_policy_update(1) is None
    # The same version with a good checkpoint goes through afterwards.
    env.fleet.proxies["addr-b"].reject_check = ""
    assert (await env.coordinator.update_policy(1, "/ckpt/v1")).complete


async def test_an_unreachable_proxy_fails_the_check(env: Env) -> None:
    await env.add("a", "b")
    env.fleet.proxies["addr-a"].down = True
    with pytest.raises(FailedPrecondition, match=r"addr-a \(a\) did not answer"):
        await env.coordinator.update_policy(1, "/ckpt/v1")
    assert not env.fleet.proxies["addr-b"].paused
    assert await env.store.current_policy() is None


async def test_a_failed_load_resumes_the_proxy_on_its_previous_version_and_names_it(env: Env) -> None:
    await env.add("a", "b")
    env.fleet.proxies["addr-b"].fail_load = "out of memory"
    outcome = await env.coordinator.update_policy(1, "/ckpt/v1")
    assert not outcome.complete
    states = {p.proxy_id: (p.state, p.address, p.error) for p in outcome.proxies}
    assert states["a"] == (ProxyUpdateState.UPDATED, "addr-a", "")
    assert states["b"][:2] == (ProxyUpdateState.FAILED, "addr-b")
    assert "out of memory" in states["b"][2]
    assert not env.fleet.proxies["addr-b"].paused  # resumed: it serves its previous version
    assert env.fleet.proxies["addr-b"].policy_version == "0"
    assert [c for a, c in env.fleet.calls if a == "addr-b"] == ["check", "pause", "load", "resume"]
    stored = {p.proxy_id: p for p in await env.store.list_proxies()}
    assert not stored["b"].paused
    assert "out of memory" in stored["b"].error
    assert stored["b"].version == 0
    assert stored["a"].version == 1
    assert not stored["a"].paused
    _, proxies = await env.coordinator.get_policy()
    assert [(p.proxy_id, p.version, p.paused, bool(p.error)) for p in proxies] == [
        ("a", 1, False, False),
        ("b", 0, False, True),  # behind the fleet: its reason stays
    ]


async def test_a_version_no_proxy_could_load_is_not_stored_and_nothing_stays_paused(env: Env) -> None:
    await env.add("a", "b")
    env.fleet.proxies["addr-a"].fail_load = "shape mismatch in layer 0"
    env.fleet.proxies["addr-b"].fail_load = "disk full"
    with pytest.raises(FailedPrecondition) as refused:
        await env.coordinator.update_policy(1, "/ckpt/v1")
    message = refused.value.message
    assert "nothing was stored" in message
    assert "addr-a (a): addr-a: shape mismatch in layer 0" in message
    assert "addr-b (b): addr-b: disk full" in message
    assert await env.store.current_policy() is None
    assert await env.store.get_policy_update(1) is None
    assert not any(p.paused for p in env.fleet.proxies.values())
    assert all(p.policy_version == "0" for p in env.fleet.proxies.values())
    # A proxy that restarts now is handed the previous policy, never the version that failed.
    assert (await env.coordinator.register_proxy("a", "addr-a", "scripted")).version == 0
    # The version number is free again: a good checkpoint (another path) goes through.
    env.fleet.proxies["addr-a"].fail_load = env.fleet.proxies["addr-b"].fail_load = ""
    assert (await env.coordinator.update_policy(1, "/ckpt/v1-fixed")).complete


async def test_the_version_is_stored_at_the_first_load_and_late_proxies_are_driven(env: Env) -> None:
    await env.add("a")
    gate = asyncio.Event()
    env.fleet.proxies["addr-a"].load_gate = gate
    update = asyncio.create_task(env.coordinator.update_policy(1, "/ckpt/v1"))
    await env.fleet.load_started.wait()
    assert await env.store.current_policy() is None  # nothing loaded yet: a starting proxy keeps version 0
    env.fleet.add("addr-late")
    assert (await env.coordinator.register_proxy("late", "addr-late", "scripted")).version == 0
    gate.set()
    outcome = await update
    assert outcome.complete
    assert [p.proxy_id for p in outcome.proxies] == ["a", "late"]
    assert env.fleet.proxies["addr-late"].policy_version == "1"
    current = await env.store.current_policy()
    assert current is not None
    assert current.version == 1


async def test_versions_must_increase_and_replays_return_the_stored_outcome(env: Env) -> None:
    await env.add("a")
    first = await env.coordinator.update_policy(2, "/ckpt/v2")
    loads = env.fleet.proxies["addr-a"].loads
    with pytest.raises(FailedPrecondition, match="not above the current version 2"):
        await env.coordinator.update_policy(1, "/ckpt/v1")
    again = await env.coordinator.update_policy(2, "/ckpt/v2")
    assert again.replayed
    assert again.complete
    assert again.proxies == first.proxies
    assert again.policy == first.policy
    assert env.fleet.proxies["addr-a"].loads == loads  # nothing reloaded
    with pytest.raises(AlreadyExists, match="'/ckpt/v2'"):
        await env.coordinator.update_policy(2, "/ckpt/other")


async def test_replaying_an_incomplete_update_retries_the_failed_proxies(env: Env) -> None:
    await env.add("a", "b")
    env.fleet.proxies["addr-b"].fail_load = "disk full"
    assert not (await env.coordinator.update_policy(1, "/ckpt/v1")).complete
    env.fleet.proxies["addr-b"].fail_load = ""
    env.fleet.calls.clear()
    replay = await env.coordinator.update_policy(1, "/ckpt/v1")
    assert replay.replayed
    assert replay.complete
    assert {a for a, _ in env.fleet.calls} == {"addr-b"}  # only the failed one was driven again
    assert not env.fleet.proxies["addr-b"].paused
    assert env.fleet.proxies["addr-b"].policy_version == "1"
    stored = await env.store.get_policy_update(1)
    assert stored is not None
    assert stored.outcome is not None
    assert stored.outcome.complete


async def test_an_incomplete_superseded_update_is_not_retried(env: Env) -> None:
    await env.add("a", "b")
    env.fleet.proxies["addr-b"].fail_load = "disk full"
    await env.coordinator.update_policy(1, "/ckpt/v1")
    env.fleet.proxies["addr-b"].fail_load = ""
    await env.coordinator.update_policy(2, "/ckpt/v2")
    old = await env.coordinator.update_policy(1, "/ckpt/v1")
    assert old.replayed
    assert not old.complete
    assert env.fleet.proxies["addr-b"].policy_version == "2"


async def test_concurrent_updates(env: Env) -> None:
    await env.add("a", "b")
    gate = asyncio.Event()
    env.fleet.proxies["addr-a"].load_gate = gate
    first = asyncio.create_task(env.coordinator.update_policy(1, "/ckpt/v1"))
    await env.fleet.load_started.wait()
    with pytest.raises(Aborted, match="version 1 is in progress"):
        await env.coordinator.update_policy(2, "/ckpt/v2")
    with pytest.raises(Aborted):
        await env.coordinator.update_policy(1, "/ckpt/other")
    same = asyncio.create_task(env.coordinator.update_policy(1, "/ckpt/v1"))
    await asyncio.sleep(0.01)
    assert not same.done()
    gate.set()
    a, b = await asyncio.gather(first, same)
    assert a.complete
    assert not a.replayed
    assert b.replayed
    assert b.proxies == a.proxies
    assert env.fleet.proxies["addr-a"].loads == 1
    assert (await env.coordinator.update_policy(2, "/ckpt/v2")).complete


async def test_a_cancelled_caller_does_not_stop_the_update(env: Env) -> None:
    await env.add("a")
    gate = asyncio.Event()
    env.fleet.proxies["addr-a"].load_gate = gate
    caller = asyncio.create_task(env.coordinator.update_policy(1, "/ckpt/v1"))
    await env.fleet.load_started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    gate.set()
    await env.coordinator.close()  # waits for the update in progress
    assert env.fleet.proxies["addr-a"].policy_version == "1"
    assert not env.fleet.proxies["addr-a"].paused
    stored = await env.store.get_policy_update(1)
    assert stored is not None
    assert stored.outcome is not None
    assert stored.outcome.complete
    assert (await env.coordinator.update_policy(1, "/ckpt/v1")).replayed


async def test_a_proxy_lost_mid_update_is_named_and_the_others_are_updated(env: Env) -> None:
    await env.add("a", "b", "c")
    gate = asyncio.Event()
    env.fleet.proxies["addr-b"].load_gate = gate
    update = asyncio.create_task(env.coordinator.update_policy(1, "/ckpt/v1"))
    await env.fleet.load_started.wait()
    env.fleet.proxies["addr-b"].down = True
    gate.set()
    outcome = await update
    states = {p.proxy_id: p.state for p in outcome.proxies}
    assert states == {"a": ProxyUpdateState.UPDATED, "b": ProxyUpdateState.FAILED, "c": ProxyUpdateState.UPDATED}
    assert "addr-b" in next(p.error for p in outcome.proxies if p.proxy_id == "b")
    # The dead proxy was left paused: it does not block the next update, and is named again.
    nxt = await env.coordinator.update_policy(2, "/ckpt/v2")
    assert {p.proxy_id: p.state for p in nxt.proxies}["b"] is ProxyUpdateState.FAILED
    assert env.fleet.proxies["addr-a"].policy_version == "2"
    # It comes back (a restart re-registers it) and the replay of the current version brings it in.
    env.fleet.add("addr-b2")
    assert (await env.coordinator.register_proxy("b", "addr-b2", "scripted")).version == 2
    replay = await env.coordinator.update_policy(2, "/ckpt/v2")
    assert replay.complete
    assert env.fleet.proxies["addr-b2"].policy_version == "2"


async def test_a_restarted_coordinator_reads_the_stored_policy(env: Env) -> None:
    await env.add("a")
    await env.coordinator.update_policy(3, "/ckpt/v3")
    coordinator = await env.reopen()
    assert await coordinator.current_policy() == (await env.store.current_policy())
    assert (await coordinator.current_policy()).version == 3
    assert (await coordinator.register_proxy("late", "addr-late", "scripted")).weights_path == "/ckpt/v3"
    with pytest.raises(FailedPrecondition, match="not above the current version 3"):
        await coordinator.update_policy(2, "/ckpt/v2")
    assert (await coordinator.update_policy(3, "/ckpt/v3")).replayed


async def test_an_update_interrupted_by_a_restart_is_finished_by_the_replay(env: Env) -> None:
    await env.add("a", "b")
    # The server stored version 1 (persist before act) and stopped before any proxy was driven.
    assert await env.store.insert_policy(PolicyRecord(1, "/ckpt/v1", 5.0))
    coordinator = await env.reopen()
    assert (await coordinator.register_proxy("c", "addr-c", "scripted")).version == 1
    env.fleet.add("addr-c")
    outcome = await coordinator.update_policy(1, "/ckpt/v1")
    assert outcome.replayed
    assert outcome.complete
    assert [p.proxy_id for p in outcome.proxies] == ["a", "b", "c"]
    assert all(p.policy_version == "1" for p in env.fleet.proxies.values())


async def test_weights_synced_stamps_every_proxy_without_a_check_or_load(env: Env) -> None:
    """A trainer that synced weights into its own inference servers moves the fleet's version alone."""
    await env.add("a", "b")
    env.fleet.proxies["addr-a"].weights_path = "/served"
    env.fleet.proxies["addr-b"].reject_check = "would refuse any checkpoint"  # not asked: nothing to check
    with pytest.raises(InvalidArgument, match="no weights_path"):
        await env.coordinator.update_policy(1, "/ckpt/v1", weights_synced=True)
    with pytest.raises(InvalidArgument, match="weights_synced"):
        await env.coordinator.update_policy(1, "")
    outcome = await env.coordinator.update_policy(1, "", weights_synced=True)
    assert outcome.complete
    assert [o.state for o in outcome.proxies] == [ProxyUpdateState.UPDATED] * 2
    names = [name for _, name in env.fleet.calls]
    assert "check" not in names
    assert "load" not in names
    for address in ("addr-a", "addr-b"):
        proxy = env.fleet.proxies[address]
        assert (proxy.policy_version, proxy.paused, proxy.loads) == ("1", False, 0)
    assert env.fleet.proxies["addr-a"].weights_path == "/served"  # what it loaded last is kept
    stored, _ = await env.coordinator.get_policy()
    assert (stored.version, stored.weights_path) == (1, "")
    # Idempotent by version; a checkpoint for the same version is another update.
    assert (await env.coordinator.update_policy(1, "", weights_synced=True)).replayed
    with pytest.raises(AlreadyExists):
        await env.coordinator.update_policy(1, "/ckpt/v1")
    # A proxy registering later is handed the version with no path: it stamps it without a load.
    env.fleet.add("addr-c")
    assert (await env.coordinator.register_proxy("c", "addr-c", "vllm")).weights_path == ""


async def test_a_proxy_that_cannot_stamp_synced_weights_stays_paused_until_the_replay(env: Env) -> None:
    """Its backend serves the trainer's new weights already: resumed, it would stamp them with the old version."""
    await env.add("a", "b")
    await env.coordinator.update_policy(1, "", weights_synced=True)
    env.fleet.proxies["addr-b"].fail_load = "stamp refused"
    outcome = await env.coordinator.update_policy(2, "", weights_synced=True)
    assert not outcome.complete
    states = {o.proxy_id: (o.state, "left paused" in o.error) for o in outcome.proxies}
    assert states == {"a": (ProxyUpdateState.UPDATED, False), "b": (ProxyUpdateState.FAILED, True)}
    b = env.fleet.proxies["addr-b"]
    assert (env.fleet.proxies["addr-a"].policy_version, b.policy_version, b.paused) == ("2", "1", True)
    b.fail_load = ""
    replay = await env.coordinator.update_policy(2, "", weights_synced=True)
    assert replay.complete
    assert (b.policy_version, b.paused) == ("2", False)


async def test_a_synced_version_no_proxy_could_stamp_is_not_stored_and_they_stay_paused(env: Env) -> None:
    await env.add("a")
    env.fleet.proxies["addr-a"].fail_load = "stamp refused"
    with pytest.raises(FailedPrecondition, match="left paused"):
        await env.coordinator.update_policy(1, "", weights_synced=True)
    assert await env.store.current_policy() is None
    assert env.fleet.proxies["addr-a"].paused
    env.fleet.proxies["addr-a"].fail_load = ""
    assert (await env.coordinator.update_policy(1, "", weights_synced=True)).complete
    assert not env.fleet.proxies["addr-a"].paused
