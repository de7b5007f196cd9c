"""The registration loop against a fake rollout server: register, heartbeat, re-register, drain, cancel."""

from __future__ import annotations

import asyncio
import dataclasses

from gateway.core import Capacity, SessionPipeline
from gateway.models import HarnessConfig, PipelineConfig, SessionSpec, Stage
from gateway.registration import HeartbeatReply, Lease, RegistrationLoop
from gateway.testing import FakeAgentRunner, FakeProxy, FakeRuntimeFactory
from polar_core.errors import NotFound, Unavailable


@dataclasses.dataclass
class FakeRollout:
    registrations: list[tuple[str, str, int]] = dataclasses.field(default_factory=list)
    beats: list[Capacity] = dataclasses.field(default_factory=list)
    replies: list[HeartbeatReply | Exception] = dataclasses.field(default_factory=list)
    register_failures: int = 0

    async def register(
        self, gateway_id: str, address: str, capacity: int, labels: dict[str, str], version: str
    ) -> Lease:
        if self.register_failures:
            self.register_failures -= 1
            raise Unavailable("rollout server starting")
        self.registrations.append((gateway_id, address, capacity))
        return Lease(heartbeat_interval_s=0.01, lease_ttl_s=1.0)

    async def heartbeat(self, capacity: Capacity) -> HeartbeatReply:
        self.beats.append(capacity)
        reply = self.replies.pop(0) if self.replies else HeartbeatReply()
        if isinstance(reply, Exception):
            raise reply
        return reply


async def test_register_heartbeat_reregister_drain_and_cancel() -> None:
    config = PipelineConfig(max_sessions=3)
    proxy = FakeProxy()
    agents = FakeAgentRunner(proxy, run_s=30.0)
    pipeline = SessionPipeline(config, gateway_id="gw", runtimes=FakeRuntimeFactory(), agents=agents, proxy=proxy)
    await pipeline.start_session(SessionSpec(session_id="s1", task_id="t", harness=HarnessConfig("fake")))
    rollout = FakeRollout(
        register_failures=1,
        replies=[HeartbeatReply(), NotFound("forgot you"), HeartbeatReply(True, ("s1", "unknown"))],
    )
    loop = RegistrationLoop(pipeline, rollout, address="h:1", default_interval_s=0.01)
    loop.start()
    try:
        async with asyncio.timeout(10):
            await loop.registered.wait()
            result = await pipeline.wait_done("s1")
    finally:
        await loop.stop()
        await pipeline.close(grace_s=1.0)
    assert rollout.registrations == [("gw", "h:1", 3), ("gw", "h:1", 3)]  # once at start, once after NotFound
    assert rollout.beats[0].active == 1
    assert rollout.beats[0].capacity == 3
    assert {s.stage for s in rollout.beats[0].stages} == {Stage.INIT, Stage.READY, Stage.RUNNING, Stage.POSTRUN}
    assert pipeline.capacity().draining
    assert result.status.value == "cancelled"
