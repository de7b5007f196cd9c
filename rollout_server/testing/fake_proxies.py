"""An in-memory :class:`~rollout_server.ports.ProxyClient`: model proxies by address, steered through attributes."""

from __future__ import annotations

import asyncio
import dataclasses

from polar_core.errors import FailedPrecondition, Unavailable
from polar_core.policy_version import format_version, parse_version
from rollout_server.ports import ProxyPolicyView

__all__ = ["FakeProxy", "FakeProxyClient"]


@dataclasses.dataclass
class FakeProxy:
    """One fake proxy's state and behaviour.

    Attributes:
        policy_version: The version it stamps, in its wire form.
        weights_path: What it loaded last.
        paused: Whether its gate is closed.
        down: Every call fails with ``Unavailable``.
        reject_check: A non-empty reason makes CheckWeights fail with it.
        fail_load: A non-empty reason makes LoadWeights (and SetPolicyVersion) fail with it.
        loads: How many loads actually ran.
        load_gate: When set, LoadWeights waits for it (tests hold an update in the middle).
    """

    policy_version: str = "0"
    weights_path: str = ""
    paused: bool = False
    down: bool = False
    reject_check: str = ""
    fail_load: str = ""
    loads: int = 0
    load_gate: asyncio.Event | None = None


class FakeProxyClient:
    """Proxies held in memory by address; unknown addresses are unreachable."""

    def __init__(self) -> None:
        self.proxies: dict[str, FakeProxy] = {}
        self.calls: list[tuple[str, str]] = []  # (address, rpc name)
        self.load_started = asyncio.Event()

    def add(self, address: str) -> FakeProxy:
        """Add (or replace) a proxy at ``address``."""
        proxy = self.proxies[address] = FakeProxy()
        return proxy

    def _get(self, address: str, name: str) -> FakeProxy:
        self.calls.append((address, name))
        proxy = self.proxies.get(address)
        if proxy is None or proxy.down:
            raise Unavailable(f"{address}: connection refused")
        return proxy

    async def check_weights(self, address: str, weights_path: str) -> str:
        """Accept unless ``reject_check`` is set."""
        proxy = self._get(address, "check")
        if proxy.reject_check:
            raise FailedPrecondition(f"{address}: {proxy.reject_check}")
        return "FakeForCausalLM"

    async def pause(self, address: str, *, abort_in_flight: bool, drain_timeout_s: float) -> tuple[int, int]:
        """Close the gate."""
        self._get(address, "pause").paused = True
        return 0, 0

    async def load_weights(self, address: str, policy_version: int, weights_path: str) -> float:
        """Load (waiting on ``load_gate``), unless ``fail_load`` is set or the proxy went down meanwhile."""
        proxy = self._get(address, "load")
        if not proxy.paused:
            raise FailedPrecondition(f"{address}: generation is not paused")
        self.load_started.set()
        if proxy.load_gate is not None:
            await proxy.load_gate.wait()
        if proxy.down:
            raise Unavailable(f"{address}: connection reset")
        if proxy.fail_load:
            raise FailedPrecondition(f"{address}: {proxy.fail_load}")
        stamp = format_version(policy_version)
        if (proxy.policy_version, proxy.weights_path) != (stamp, weights_path):
            proxy.loads += 1
            proxy.policy_version, proxy.weights_path = stamp, weights_path
        return 0.25

    async def set_policy_version(self, address: str, policy_version: int) -> None:
        """Stamp the version without a load (weights synced outside Polar); the path is kept."""
        proxy = self._get(address, "set_version")
        if proxy.fail_load:
            raise FailedPrecondition(f"{address}: {proxy.fail_load}")
        proxy.policy_version = format_version(policy_version)

    async def resume(self, address: str) -> int:
        """Open the gate."""
        self._get(address, "resume").paused = False
        return 0

    async def get_policy(self, address: str) -> ProxyPolicyView:
        """Report the state."""
        proxy = self._get(address, "get")
        return ProxyPolicyView(parse_version(proxy.policy_version), proxy.weights_path, proxy.paused, 0)

    async def close(self) -> None:
        """Nothing to close."""
