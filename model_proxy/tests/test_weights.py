"""The proxy's side of policy updates: LoadWeights' rules, and joining a fleet before admitting a call."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from model_proxy import convert
from model_proxy.app import ProxyApp
from model_proxy.fleet_membership import FleetMembership, FleetPolicy
from model_proxy.tests.conftest import FakeBackend
from polar_core.errors import FailedPrecondition, InvalidArgument, Unavailable


class FakeRegistrar:
    def __init__(self, policy: FleetPolicy, *, failures: int = 0) -> None:
        self.policy = policy
        self.failures = failures
        self.calls: list[tuple[str, str, str]] = []
        self.closed = False
        self.retried = asyncio.Event()  # set from the third registration on

    async def register(self, proxy_id: str, address: str, backend: str) -> FleetPolicy:
        self.calls.append((proxy_id, address, backend))
        if len(self.calls) >= 3:
            self.retried.set()
        if self.failures:
            self.failures -= 1
            raise Unavailable("rollout server is starting")
        return self.policy

    async def close(self) -> None:
        self.closed = True


async def test_load_needs_a_pause_sets_the_version_after_loading_and_is_idempotent(
    app: ProxyApp, backend: FakeBackend
) -> None:
    with pytest.raises(InvalidArgument):
        await app.weights.load(-1, "/ckpt/v1")
    with pytest.raises(InvalidArgument):
        await app.weights.load(1, "")
    with pytest.raises(InvalidArgument):
        await app.weights.check("")
    with pytest.raises(FailedPrecondition, match="not paused"):
        await app.weights.load(1, "/ckpt/v1")
    assert app.engine.policy_version == "0"
    await app.engine.gate.pause(abort_in_flight=False, drain_timeout_s=1)
    previous, _ = await app.weights.load(1, "/ckpt/v1")
    assert previous == "0"
    assert backend.loaded == ["/ckpt/v1"]
    assert app.weights.served().policy_version == "1"
    assert app.weights.served().weights_path == "/ckpt/v1"
    assert app.weights.served().paused
    assert await app.weights.load(1, "/ckpt/v1") == ("1", 0.0)
    assert backend.loaded == ["/ckpt/v1"]  # not loaded twice
    backend.load_error = FailedPrecondition("checkpoint '/ckpt/v2' does not fit the served model")
    with pytest.raises(FailedPrecondition, match="does not fit"):
        await app.weights.load(2, "/ckpt/v2")
    assert (app.engine.policy_version, app.weights.weights_path) == ("1", "/ckpt/v1")
    assert app.engine.gate.paused


async def test_setting_the_version_waits_for_a_load_and_keeps_the_weights(app: ProxyApp, backend: FakeBackend) -> None:
    with pytest.raises(InvalidArgument):
        await app.weights.set_version(-1)
    await app.engine.gate.pause(abort_in_flight=False, drain_timeout_s=1)
    await app.weights.load(1, "/ckpt/v1")
    release = asyncio.Event()
    real_load = backend.load_weights

    async def slow_load(path: str) -> None:
        await release.wait()
        await real_load(path)

    backend.load_weights = slow_load  # type: ignore[method-assign]
    loading = asyncio.create_task(app.weights.load(2, "/ckpt/v2"))
    await asyncio.sleep(0)
    setting = asyncio.create_task(app.weights.set_version(3))
    await asyncio.sleep(0.01)
    assert not setting.done()  # the load holds the weights' lock
    release.set()
    assert (await loading)[0] == "1"
    assert await setting == "2"
    served = app.weights.served()
    assert (served.policy_version, served.weights_path) == ("3", "/ckpt/v2")
    assert app.weights.version_number == 3
    assert await app.weights.set_version(3) == "3"  # idempotent


@pytest.mark.parametrize("text", ["", "v2", "07", "-1", "2.0"])
def test_a_requested_version_must_be_decimal_digits(text: str) -> None:
    with pytest.raises(InvalidArgument, match="decimal digits"):
        convert.policy_version_from_proto(text)
    assert convert.policy_version_from_proto("12") == 12


def _membership(app: ProxyApp, registrar: FakeRegistrar) -> FleetMembership:
    return FleetMembership(
        app.weights,
        app.engine.gate,
        registrar,
        proxy_id="p1",
        address="127.0.0.1:1",
        backend="fake",
        retry_s=0.01,
        retry_max_s=0.02,
    )


async def test_joining_loads_the_fleet_policy_before_opening_the_gate(
    make_app: Callable[..., ProxyApp], backend: FakeBackend
) -> None:
    app = make_app(backend)
    await app.engine.gate.pause(abort_in_flight=False, drain_timeout_s=1)
    registrar = FakeRegistrar(FleetPolicy(3, "/ckpt/v3"), failures=2)
    membership = _membership(app, registrar)
    membership.start()
    await asyncio.wait_for(membership.ready.wait(), 5)
    assert len(registrar.calls) == 3
    assert registrar.calls[-1] == ("p1", "127.0.0.1:1", "fake")
    assert backend.loaded == ["/ckpt/v3"]
    assert app.engine.policy_version == "3"
    assert not app.engine.gate.paused
    await membership.stop()
    assert registrar.closed


async def test_a_refused_start_up_load_is_not_tried_again_until_the_fleet_moves(
    make_app: Callable[..., ProxyApp], backend: FakeBackend
) -> None:
    app = make_app(backend)
    await app.engine.gate.pause(abort_in_flight=False, drain_timeout_s=1)
    backend.load_error = FailedPrecondition("no config.json in '/ckpt/v2'")
    attempts: list[str] = []
    real_load = backend.load_weights

    async def counted(path: str) -> None:
        attempts.append(path)
        await real_load(path)

    backend.load_weights = counted  # type: ignore[method-assign]
    registrar = FakeRegistrar(FleetPolicy(2, "/ckpt/v2"))
    membership = _membership(app, registrar)
    membership.start()
    await asyncio.wait_for(registrar.retried.wait(), 5)
    assert app.engine.gate.paused
    assert "refused by this proxy's backend" in membership.last_error
    assert membership.refused == FleetPolicy(2, "/ckpt/v2")
    assert attempts == ["/ckpt/v2"]  # registered again and again, loaded once
    assert app.engine.policy_version == "0"
    backend.load_error = None
    registrar.policy = FleetPolicy(3, "/ckpt/v3")  # the fleet moves on
    await asyncio.wait_for(membership.ready.wait(), 5)
    assert attempts == ["/ckpt/v2", "/ckpt/v3"]
    assert app.engine.policy_version == "3"
    assert not app.engine.gate.paused
    await membership.stop()


async def test_a_failed_registration_is_retried(make_app: Callable[..., ProxyApp], backend: FakeBackend) -> None:
    app = make_app(backend)
    await app.engine.gate.pause(abort_in_flight=False, drain_timeout_s=1)
    membership = _membership(app, FakeRegistrar(FleetPolicy(2, "/ckpt/v2"), failures=3))
    membership.start()
    await asyncio.wait_for(membership.ready.wait(), 5)
    assert app.engine.policy_version == "2"
    await membership.stop()


async def test_version_zero_keeps_the_configured_weights(
    make_app: Callable[..., ProxyApp], backend: FakeBackend
) -> None:
    app = make_app(backend, policy_version="base")
    await app.engine.gate.pause(abort_in_flight=False, drain_timeout_s=1)
    membership = _membership(app, FakeRegistrar(FleetPolicy(0, "")))
    membership.start()
    await asyncio.wait_for(membership.ready.wait(), 5)
    assert app.engine.policy_version == "base"
    assert backend.loaded == []
    assert not app.engine.gate.paused
    await membership.stop()


async def test_a_fleet_version_without_a_path_is_stamped_without_a_load(
    make_app: Callable[..., ProxyApp], backend: FakeBackend
) -> None:
    """Weights the trainer synced into its inference servers itself (UpdatePolicy with weights_synced)."""
    app = make_app(backend)
    await app.engine.gate.pause(abort_in_flight=False, drain_timeout_s=1)
    membership = _membership(app, FakeRegistrar(FleetPolicy(4, "")))
    membership.start()
    await asyncio.wait_for(membership.ready.wait(), 5)
    assert app.engine.policy_version == "4"
    assert backend.loaded == []
    assert not app.engine.gate.paused
    await membership.stop()
