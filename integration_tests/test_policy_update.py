"""UpdatePolicy through real servers: a rollout server (SQLite or PostgreSQL) and model proxies that register.

Proxies are started with ``create_server`` and ``rollout_address`` set, exactly as in production; the scripted
backend changes only the version, the transformers backend loads real checkpoints of the tiny model.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest
from polar.proxy.v1 import model_proxy_service_pb2 as proxy_pb
from polar.proxy.v1 import model_proxy_service_pb2_grpc as proxy_grpc

from model_proxy.server import create_server as create_proxy
from model_proxy.settings import ProxySettings
from polar_client import RolloutClient
from polar_core.channels import open_channel
from polar_core.model_fixtures import save_tiny_model, teacher_forced_logprobs
from polar_core.server import RunningService
from rollout_server.app import RolloutApp
from rollout_server.clients import GrpcProxyClient
from rollout_server.ports import ProxyClient
from rollout_server.server import start_server as start_rollout_server
from rollout_server.settings import RolloutSettings

TOKEN = "fleet-token"
SCRIPT = {"turns": [{"text": "Hello from the policy."}] * 8}


class Proxy:
    """A proxy process's gRPC server and a stub on it."""

    def __init__(self, proxy_id: str, server: grpc.aio.Server, port: int) -> None:
        self.proxy_id = proxy_id
        self.server = server
        self.address = f"127.0.0.1:{port}"
        self.channel = open_channel(self.address, auth_token=TOKEN)
        self.stub = proxy_grpc.ModelProxyServiceStub(self.channel)
        self.stopped = False

    async def policy(self) -> proxy_pb.GetPolicyResponse:
        return await self.stub.GetPolicy(proxy_pb.GetPolicyRequest(), timeout=10)

    async def chat(self, session_id: str, *, temperature: float = 1.0) -> Any:
        """One real HTTP call through the openai SDK; returns its recorded completion."""
        opened = await self.stub.OpenSession(proxy_pb.OpenSessionRequest(session_id=session_id, model="policy"))
        async with openai.AsyncOpenAI(
            base_url=opened.openai_base_url, api_key=opened.session_token, max_retries=0, timeout=60
        ) as client:
            reply = await client.chat.completions.create(
                model="policy",
                messages=[{"role": "user", "content": "Say something."}],
                max_tokens=8,
                temperature=temperature,
            )
        assert reply.choices[0].finish_reason in ("stop", "length")
        listed = await self.stub.ListCompletions(proxy_pb.ListCompletionsRequest(session_id=session_id))
        return listed.completions[-1]

    async def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            await self.server.stop(None)
        await self.channel.close(None)


class Fleet:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.rollout: RunningService[RolloutApp] | None = None
        self.proxies: list[Proxy] = []

    @property
    def target(self) -> str:
        assert self.rollout is not None
        return f"127.0.0.1:{self.rollout.port}"

    def settings(self, store_url: str) -> RolloutSettings:
        return RolloutSettings(port=0, state_dir=self.tmp_path / "rollout", store_url=store_url, auth_token=TOKEN)

    async def start_rollout(self, store_url: str, proxy_client: ProxyClient | None = None) -> None:
        self.rollout = await start_rollout_server(self.settings(store_url), proxy_client=proxy_client)

    async def add_proxy(self, proxy_id: str, **kw: Any) -> Proxy:
        values: dict[str, Any] = {
            "port": 0,
            "state_dir": self.tmp_path / proxy_id / uuid.uuid4().hex[:6],
            "auth_token": TOKEN,
            "model": "tiny",
            "backend": "scripted",
            "backend_options": SCRIPT,
            "rollout_address": self.target,
            "proxy_id": proxy_id,
            "gc_freeze": False,
            "fsync": False,
        }
        values.update(kw)
        server, port = await create_proxy(ProxySettings(**values))
        proxy = Proxy(proxy_id, server, port)
        self.proxies.append(proxy)
        return proxy

    async def close(self) -> None:
        for proxy in self.proxies:
            await proxy.stop()
        if self.rollout is not None:
            await self.rollout.stop(None)


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    f = Fleet(tmp_path)
    yield f
    await f.close()


async def eventually(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 30.0) -> None:
    """Poll ``check`` until it holds."""
    deadline = time.monotonic() + timeout_s
    for _ in range(100_000):
        if await check():
            return
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def registered(client: RolloutClient, n: int) -> None:
    async def check() -> bool:
        return len((await client.get_policy()).proxies) >= n

    await eventually(check, f"{n} registered proxies")


def checkpoint(tmp_path: Path, name: str) -> str:
    path = tmp_path / "ckpt" / name
    path.mkdir(parents=True)
    return str(path)


async def test_update_moves_the_fleet_and_a_late_proxy_loads_it_first(
    fleet: Fleet, tmp_path: Path, store_url: str
) -> None:
    await fleet.start_rollout(store_url)
    p1, p2 = await fleet.add_proxy("p1"), await fleet.add_proxy("p2")
    async with RolloutClient(fleet.target, token=TOKEN) as client:
        await registered(client, 2)
        assert (await client.get_policy()).policy.version == 0
        v1 = checkpoint(tmp_path, "v1")
        update = await client.update_policy(1, v1)
        print(f"scripted fleet of 2: {update.seconds:.3f} s per update")
        assert update.complete
        assert not update.replayed
        assert (update.version, update.weights_path) == (1, v1)
        assert [(p.proxy_id, p.updated, p.error) for p in update.proxies] == [("p1", True, ""), ("p2", True, "")]
        for proxy in (p1, p2):
            served = await proxy.policy()
            assert (served.policy_version, served.weights_path, served.paused) == ("1", v1, False)

        again = await client.update_policy(1, v1)
        assert again.replayed
        assert again.complete
        assert again.proxies == update.proxies
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await client.update_policy(1, checkpoint(tmp_path, "other"))
        assert exc.value.code() == grpc.StatusCode.ALREADY_EXISTS
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await client.update_policy(0, v1)
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT

        missing = str(tmp_path / "ckpt" / "missing")
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await client.update_policy(2, missing)
        assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "is not a directory" in (exc.value.details() or "")
        assert p1.address in (exc.value.details() or "")
        for proxy in (p1, p2):
            served = await proxy.policy()
            assert (served.policy_version, served.paused) == ("1", False)
        assert (await client.get_policy()).policy.version == 1

        v3 = checkpoint(tmp_path, "v3")
        assert (await client.update_policy(3, v3)).complete
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await client.update_policy(2, checkpoint(tmp_path, "v2"))
        assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "not above the current version 3" in (exc.value.details() or "")

        # A proxy started later serves the stored version from its very first call.
        p3 = await fleet.add_proxy("p3")
        record = await p3.chat("late-session")
        assert record.policy_version == "3"
        assert len(record.response_token_ids) > 0
        assert (await p3.policy()).weights_path == v3

        state = await client.get_policy()
        assert (state.policy.version, state.policy.weights_path) == (3, v3)
        assert state.policy.updated_at.seconds > 0
        assert [(p.proxy_id, p.address, p.version, p.paused, p.error) for p in state.proxies] == [
            ("p1", p1.address, 3, False, ""),
            ("p2", p2.address, 3, False, ""),
            ("p3", p3.address, 3, False, ""),
        ]


class KillOnPause(GrpcProxyClient):
    """The real client, except that it stops one proxy's server just before pausing it (a crash mid-update)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.victim: Proxy | None = None

    async def pause(self, address: str, *, abort_in_flight: bool, drain_timeout_s: float) -> tuple[int, int]:
        victim = self.victim
        if victim is not None and address == victim.address:
            self.victim = None
            await victim.server.stop(None)
            victim.stopped = True
        return await super().pause(address, abort_in_flight=abort_in_flight, drain_timeout_s=drain_timeout_s)


async def test_a_proxy_killed_mid_update_is_named_and_catches_up_when_it_returns(fleet: Fleet, tmp_path: Path) -> None:
    store_url = f"sqlite:///{tmp_path / 'rollout.sqlite3'}"
    proxies = KillOnPause(auth_token=TOKEN, timeout_s=5)
    await fleet.start_rollout(store_url, proxies)
    p1, p2 = await fleet.add_proxy("p1"), await fleet.add_proxy("p2")
    async with RolloutClient(fleet.target, token=TOKEN) as client:
        await registered(client, 2)
        proxies.victim = p2
        v1 = checkpoint(tmp_path, "v1")
        update = await client.update_policy(1, v1, pause_mode="abort")
        assert not update.complete
        assert [p.proxy_id for p in update.failed] == ["p2"]
        assert update.failed[0].address == p2.address
        assert update.failed[0].error
        assert (await p1.policy()).policy_version == "1"
        state = {p.proxy_id: p for p in (await client.get_policy()).proxies}
        assert state["p2"].paused
        assert state["p2"].error
        assert (state["p1"].version, state["p1"].paused) == (1, False)

        # The proxy comes back (same id, new port): it loads version 1 before it serves, and the replay
        # of version 1 completes the update.
        back = await fleet.add_proxy("p2")
        record = await back.chat("after-restart")
        assert record.policy_version == "1"
        replay = await client.update_policy(1, v1)
        assert replay.replayed
        assert replay.complete
        assert {p.proxy_id: p.address for p in replay.proxies} == {"p1": p1.address, "p2": back.address}


class SlowLoad(GrpcProxyClient):
    """The real client, with each LoadWeights held until ``release`` is set (a large checkpoint)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.loading = asyncio.Event()
        self.release = asyncio.Event()

    async def load_weights(self, address: str, policy_version: int, weights_path: str) -> float:
        self.loading.set()
        await self.release.wait()
        return await super().load_weights(address, policy_version, weights_path)


async def test_a_disconnected_trainer_and_a_concurrent_update(fleet: Fleet, tmp_path: Path) -> None:
    store_url = f"sqlite:///{tmp_path / 'rollout.sqlite3'}"
    proxies = SlowLoad(auth_token=TOKEN, timeout_s=5)
    await fleet.start_rollout(store_url, proxies)
    p1 = await fleet.add_proxy("p1")
    v1 = checkpoint(tmp_path, "v1")
    async with RolloutClient(fleet.target, token=TOKEN) as client:
        await registered(client, 1)
        first = asyncio.create_task(client.update_policy(1, v1, timeout_s=0.5))
        await proxies.loading.wait()
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await first  # the trainer gives up (its deadline passes) while the proxy loads
        assert exc.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await client.update_policy(2, checkpoint(tmp_path, "v2"))
        assert exc.value.code() == grpc.StatusCode.ABORTED
        assert "version 1 is in progress" in (exc.value.details() or "")
        again = asyncio.create_task(client.update_policy(1, v1))  # waits for the running update
        await asyncio.sleep(0.2)
        assert not again.done()
        proxies.release.set()
        outcome = await again
        assert outcome.complete
        assert outcome.replayed
        assert (await p1.policy()).policy_version == "1"


async def test_transformers_proxy_samples_from_the_new_weights(fleet: Fleet, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    dir_a = save_tiny_model(tmp_path / "ckpt" / "a", seed=0)
    dir_b = save_tiny_model(tmp_path / "ckpt" / "b", seed=1)
    await fleet.start_rollout(f"sqlite:///{tmp_path / 'rollout.sqlite3'}")
    proxy = await fleet.add_proxy("tf", model=str(dir_a), backend="transformers", backend_options={})
    async with RolloutClient(fleet.target, token=TOKEN) as client:
        await registered(client, 1)
        before = await proxy.chat("before")
        assert before.policy_version == "0"
        seconds: list[float] = []
        for version, path in ((1, dir_b), (2, dir_a), (3, dir_b)):
            update = await client.update_policy(version, str(path))
            assert update.complete
            seconds.append(update.seconds)
            print(
                f"tiny model, transformers: update to v{version} took {update.seconds:.3f} s "
                f"(load {update.proxies[0].load_seconds:.3f} s)"
            )
        record = await proxy.chat("after")
    assert record.policy_version == "3"
    prompt, response = list(record.prompt_token_ids), list(record.response_token_ids)
    loader: Any = AutoModelForCausalLM
    model_a, model_b = loader.from_pretrained(dir_a).eval(), loader.from_pretrained(dir_b).eval()
    assert list(record.response_logprobs) == pytest.approx(teacher_forced_logprobs(model_b, prompt, response), abs=1e-4)
    from_a = teacher_forced_logprobs(model_a, prompt, response)
    assert max(abs(x - y) for x, y in zip(record.response_logprobs, from_a, strict=True)) > 1e-2
    assert seconds


async def test_the_embedded_stack_registers_its_proxy(tmp_path: Path) -> None:
    from polar_run.embedded import EmbeddedStack, StackOptions

    options = StackOptions(state_dir=tmp_path / "stack", model="tiny", backend="scripted", backend_options=SCRIPT)
    async with EmbeddedStack.start(options) as stack, RolloutClient(stack.rollout_address, token=stack.token) as client:
        update = await client.update_policy(1, checkpoint(tmp_path, "v1"))
        assert update.complete
        assert [p.address for p in update.proxies] == [stack.proxy_address]


async def test_weights_synced_by_the_trainer_stamp_the_fleet_without_a_load(fleet: Fleet, tmp_path: Path) -> None:
    """verl/slime push weights into their own servers; UpdatePolicy(weights_synced) moves the version alone."""
    await fleet.start_rollout(f"sqlite:///{tmp_path / 'rollout.sqlite3'}")
    p1, p2 = await fleet.add_proxy("p1"), await fleet.add_proxy("p2")
    async with RolloutClient(fleet.target, token=TOKEN) as client:
        await registered(client, 2)
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await client.update_policy(1, checkpoint(tmp_path, "v1"), weights_synced=True)
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "give no weights_path" in (exc.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as exc:
            await client.update_policy(1)
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "weights_synced" in (exc.value.details() or "")

        update = await client.update_policy(5, weights_synced=True)
        assert update.complete
        assert (update.version, update.weights_path) == (5, "")
        for proxy in (p1, p2):
            served = await proxy.policy()
            assert (served.policy_version, served.weights_path, served.paused) == ("5", "", False)
            assert (await proxy.chat(f"synced-{proxy.proxy_id}")).policy_version == "5"
        assert (await client.update_policy(5, weights_synced=True)).replayed

        # A proxy that starts later takes the version without a checkpoint to load.
        p3 = await fleet.add_proxy("p3")
        assert (await p3.chat("late-synced")).policy_version == "5"
        state = await client.get_policy()
        assert (state.policy.version, state.policy.weights_path) == (5, "")
        assert [(p.proxy_id, p.version, p.paused) for p in state.proxies] == [
            ("p1", 5, False),
            ("p2", 5, False),
            ("p3", 5, False),
        ]
