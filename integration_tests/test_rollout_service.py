"""The RolloutService over real gRPC, with fake gateways (real GatewayService servers), on SQLite and PostgreSQL.

Covers the trainer's view (submit, watch, get, cancel, statistics), gateway backpressure, infra retries, restart
reconciliation, token authentication, at-least-once callbacks deduplicated by the trainer, and the CLI.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from polar.common.v1 import session_pb2, status_pb2, task_pb2
from polar.rollout.v1 import rollout_service_pb2 as pb
from polar.rollout.v1 import rollout_service_pb2_grpc, trainer_callback_service_pb2, trainer_callback_service_pb2_grpc

from polar_client import RolloutClient, traces_to_tensors
from polar_core.errors import InvalidArgument, Unavailable
from polar_core.server import RunningService, ServiceRegistration, start_grpc_server
from rollout_server.app import RolloutApp
from rollout_server.server import start_server
from rollout_server.settings import RolloutSettings
from rollout_server.testing.fake_gateway import FakeGateway

TOKEN = "s3cret-token"


def settings(tmp_path: Path, store_url: str = "", **kw: Any) -> RolloutSettings:
    values: dict[str, Any] = {
        "port": 0,
        "state_dir": tmp_path,
        "store_url": store_url,
        "auth_token": TOKEN,
        "dispatch_interval_s": 0.05,
        "watchdog_interval_s": 0.1,
        "retry_backoff_s": 0.05,
        "callback_backoff_s": 0.05,
        "busy_backoff_s": 0.1,
    }
    values.update(kw)
    return RolloutSettings(**values)


class Stack:
    def __init__(self) -> None:
        self.rollout: RunningService[RolloutApp] | None = None
        self.gateways: list[FakeGateway] = []

    @property
    def target(self) -> str:
        assert self.rollout is not None
        return f"127.0.0.1:{self.rollout.port}"

    async def start_rollout(self, s: RolloutSettings) -> None:
        self.rollout = await start_server(s)
        for g in self.gateways:
            g.rollout_target = self.target

    async def add_gateway(self, gid: str, *, register_capacity: int | None = None, **kw: Any) -> FakeGateway:
        g = await FakeGateway(gid, rollout_target=self.target, token=TOKEN, **kw).start()
        await g.register(register_capacity)
        self.gateways.append(g)
        return g

    async def close(self) -> None:
        if self.rollout is not None:
            await self.rollout.stop(None)
        for g in self.gateways:
            await g.stop()


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    s = Stack()
    yield s
    await s.close()


def task(task_id: str, n: int = 4, **kw: Any) -> task_pb2.Task:
    return task_pb2.Task(task_id=task_id, instruction="fix the bug", num_samples=n, timeout_seconds=60, **kw)


async def test_submit_watch_get_and_statistics(stack: Stack, tmp_path: Path, store_url: str) -> None:
    await stack.start_rollout(settings(tmp_path, store_url))
    await stack.add_gateway("g1", capacity=2)
    await stack.add_gateway("g2", capacity=2, policy_version="v2")
    async with RolloutClient(stack.target, token=TOKEN) as client:
        reply = await client.submit(task("t1", 6))
        assert reply.task_id == "t1"
        assert not reply.already_existed
        results = [r async for r in client.watch("t1")]
        assert sorted(r.sample_index for r in results) == list(range(6))
        assert {r.status for r in results} == {"resolved"}
        again = await client.submit(task("t1", 6))
        assert again.already_existed
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.submit(task("t1", 7))
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
        got = await client.get("t1")
        info = got.task
        assert info.status == status_pb2.TASK_STATUS_COMPLETED
        assert info.sessions_done == info.sessions_usable == 6
        assert info.mean_reward == 1.0
        assert [r.idempotency_key for r in got.session_results] == [r.idempotency_key for r in results]
        st = info.statistics
        assert st.calls.mean == 2
        assert st.chains.mean == 1
        assert st.session_duration_seconds.count == 6
        assert st.attempts_total == 6
        assert {b.policy_age for b in st.reward_by_policy_age} <= {0, 1}
        batch = traces_to_tensors([t for r in got.session_results for t in r.traces])
        assert tuple(batch["input_ids"].shape) == (6, 5)
        assert batch["loss_mask"][0].tolist() == [0, 0, 0, 1, 1]
        listed = await client.list(page_size=10)
        assert [t.task.task_id for t in listed.tasks] == ["t1"]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.get("missing")
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_backpressure_retry_and_early_stop(stack: Stack, tmp_path: Path) -> None:
    await stack.start_rollout(settings(tmp_path))

    def outcome(spec: session_pb2.SessionSpec) -> tuple[str, float]:
        if spec.task_id == "flaky" and spec.sample_index == 0 and spec.attempt == 1:
            return "infra_error", 0.0
        return ("unresolved", 0.0) if spec.sample_index % 2 else ("resolved", 1.0)

    # Advertises 4 slots but accepts 1: the rest is refused with RESOURCE_EXHAUSTED and retried after the hint.
    gateway = await stack.add_gateway("small", capacity=1, register_capacity=4, outcome=outcome, busy_retry_s=0.05)
    async with RolloutClient(stack.target, token=TOKEN) as client:
        await client.submit(task("flaky", 4))
        info = await asyncio.wait_for(client.wait("flaky", poll_s=0.05), 30)
        assert gateway.refused > 0
        assert info.sessions_by_status["resolved"] == 2
        assert info.sessions_by_status["unresolved"] == 2
        assert info.statistics.sessions_retried == 1
        assert ("flaky-0000", 2) in gateway.started
        gateway.delay_s = 0.5
        gateway.capacity = 8
        await stack.add_gateway("big", capacity=8, delay_s=0.01)
        await client.submit(task("early", 8, early_stop_min_usable_sessions=2))
        info = await asyncio.wait_for(client.wait("early", poll_s=0.05), 30)
        assert info.status == status_pb2.TASK_STATUS_COMPLETED
        assert info.sessions_usable >= 2
        assert info.sessions_by_status.get("cancelled", 0) >= 1
        assert info.sessions_done == 8


async def test_unauthenticated_calls_are_refused_and_change_nothing(stack: Stack, tmp_path: Path) -> None:
    await stack.start_rollout(settings(tmp_path))
    async with grpc.aio.insecure_channel(stack.target) as channel:
        stub: Any = rollout_service_pb2_grpc.RolloutServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.SubmitTask(pb.SubmitTaskRequest(task=task("sneaky")))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.RegisterGateway(pb.RegisterGatewayRequest(gateway_id="evil", address="x:1", capacity=9))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    async with RolloutClient(stack.target, token="wrong") as client:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.list()
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    async with RolloutClient(stack.target, token=TOKEN) as client:
        assert len((await client.list()).tasks) == 0
    assert stack.rollout is not None
    assert await stack.rollout.app.store.list_gateways() == []


async def test_gateway_cannot_report_for_a_session_it_was_not_given(stack: Stack, tmp_path: Path) -> None:
    await stack.start_rollout(settings(tmp_path))
    gateway = await stack.add_gateway("g", capacity=1, delay_s=5.0)
    async with RolloutClient(stack.target, token=TOKEN) as client:
        await client.submit(task("t", 1))
        for _ in range(100):
            if gateway.started:
                break
            await asyncio.sleep(0.02)
        forged = session_pb2.SessionResult(
            session_id="t-0000", task_id="t", status="resolved", reward=1.0, gateway_id="other", attempt=1
        )
        async with grpc.aio.insecure_channel(stack.target) as channel:
            stub: Any = rollout_service_pb2_grpc.RolloutServiceStub(channel)
            meta = (("authorization", f"Bearer {TOKEN}"),)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.ReportSessionResult(pb.ReportSessionResultRequest(result=forged), metadata=meta)
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            forged.session_id = "nope"
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.ReportSessionResult(pb.ReportSessionResultRequest(result=forged), metadata=meta)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
        cancelled = await client.cancel("t", "test")
        assert cancelled.status == status_pb2.TASK_STATUS_CANCELLED


async def test_restart_reattaches_running_sessions_and_retries_lost_ones(
    stack: Stack, tmp_path: Path, store_url: str
) -> None:
    # A lease that outlives the test: nothing may depend on the gateway's lease lapsing (a report refused as stale,
    # when it raced the dispatcher's running update, used to be recovered only by the lapsed lease's reconcile).
    s = settings(tmp_path, store_url, lease_ttl_s=3600.0)
    await stack.start_rollout(s)
    release = asyncio.Event()
    gateway = await stack.add_gateway("g", capacity=4, release=release)
    async with RolloutClient(stack.target, token=TOKEN) as client:
        await client.submit(task("t", 3))
        for _ in range(3000):
            if len(gateway.started) == 3:
                break
            await asyncio.sleep(0.02)
    assert len(gateway.started) == 3
    # The server may stop before it recorded the accepted starts as running; either way the lost session gets
    # a fresh attempt (see test_restart_never_reuses_the_attempt_of_an_interrupted_start in rollout_server).
    assert stack.rollout is not None
    await stack.rollout.stop(None)
    stack.rollout = None
    lost = gateway.held.pop("t-0002")  # the gateway loses one session while the server is down
    assert lost.runner is not None
    lost.runner.cancel()
    await stack.start_rollout(s)  # reconciles: two re-attached, one lost -> retried as attempt 2
    release.set()
    async with RolloutClient(stack.target, token=TOKEN) as client:
        results = [r async for r in client.watch("t")]
    assert sorted((r.session_id, r.attempt) for r in results) == [("t-0000", 1), ("t-0001", 1), ("t-0002", 2)]
    assert {r.status for r in results} == {"resolved"}
    assert ("t-0000", 2) not in gateway.started


class FlakyTrainer(trainer_callback_service_pb2_grpc.TrainerCallbackServiceServicer):
    """Fails the first two deliveries of every key; the second one is stored but its acknowledgement lost."""

    def __init__(self, reject: bool = False) -> None:
        self.calls: dict[str, int] = {}
        self.stored: dict[str, session_pb2.SessionResult] = {}
        self.reject = reject

    async def DeliverSessionResult(self, request: Any, context: Any) -> Any:
        if self.reject:
            raise InvalidArgument("not for me")
        key = request.idempotency_key
        n = self.calls[key] = self.calls.get(key, 0) + 1
        if n == 1:
            raise Unavailable("trainer busy", retry_after_s=0.01)
        duplicate = key in self.stored
        self.stored.setdefault(key, request.session_result)
        if n == 2:
            raise Unavailable("acknowledgement lost")
        return trainer_callback_service_pb2.DeliverSessionResultResponse(duplicate=duplicate)


async def _serve_trainer(servicer: FlakyTrainer) -> tuple[grpc.aio.Server, int]:
    name = trainer_callback_service_pb2.DESCRIPTOR.services_by_name["TrainerCallbackService"].full_name
    reg = ServiceRegistration(
        name,
        lambda server: trainer_callback_service_pb2_grpc.add_TrainerCallbackServiceServicer_to_server(servicer, server),
    )
    return await start_grpc_server([reg], host="127.0.0.1", port=0, auth_token=TOKEN)


class FlakyHttpTrainer:
    """A minimal HTTP/1.1 server: 503 for the first POST of every key, then stores (deduplicated) and answers 200."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.stored: dict[str, dict[str, Any]] = {}
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:] if ": " in line)
                lower = {k.lower(): v for k, v in headers.items()}
                body = json.loads(await reader.readexactly(int(lower.get("content-length", "0"))))
                key = lower["idempotency-key"]
                n = self.calls[key] = self.calls.get(key, 0) + 1
                if n == 1:
                    status, payload = "503 Service Unavailable", b"{}"
                else:
                    duplicate = key in self.stored
                    self.stored.setdefault(key, body)
                    status, payload = "200 OK", json.dumps({"duplicate": duplicate}).encode()
                head_out = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
                writer.write(head_out.encode() + b"\r\n" + payload)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def test_callbacks_deliver_each_result_exactly_once_to_a_deduplicating_trainer(
    stack: Stack, tmp_path: Path
) -> None:
    await stack.start_rollout(settings(tmp_path))
    await stack.add_gateway("g", capacity=8, delay_s=0.01)
    trainer = FlakyTrainer()
    server, port = await _serve_trainer(trainer)
    rejecting = FlakyTrainer(reject=True)
    server2, port2 = await _serve_trainer(rejecting)
    http = FlakyHttpTrainer()
    http_port = await http.start()
    try:
        async with RolloutClient(stack.target, token=TOKEN) as client:
            await client.submit(task("g", 5, callback=task_pb2.CallbackSpec(grpc_target=f"127.0.0.1:{port}")))
            await client.submit(
                task("h", 3, callback=task_pb2.CallbackSpec(http_url=f"http://127.0.0.1:{http_port}/cb"))
            )
            await client.submit(
                task("dead", 2, callback=task_pb2.CallbackSpec(grpc_target=f"127.0.0.1:{port2}", max_attempts=2))
            )
            for _ in range(300):
                infos = [(await client.get(t, summary_only=True)).task for t in ("g", "h", "dead")]
                delivered = infos[0].statistics.deliveries_delivered + infos[1].statistics.deliveries_delivered
                if delivered == 8 and infos[2].statistics.deliveries_dead_lettered == 2:
                    break
                await asyncio.sleep(0.05)
            assert delivered == 8
            assert infos[2].statistics.deliveries_dead_lettered == 2
        assert len(trainer.stored) == 5
        assert all(n == 3 for n in trainer.calls.values())  # at least once: the lost acknowledgement was resent
        assert {r.session_id for r in trainer.stored.values()} == {f"g-{i:04d}" for i in range(5)}
        assert len(http.stored) == 3
        assert all(b["session_result"]["status"] == "resolved" for b in http.stored.values())
    finally:
        await server.stop(None)
        await server2.stop(None)
        await http.stop()


async def test_cli_submit_and_status(stack: Stack, tmp_path: Path) -> None:
    await stack.start_rollout(settings(tmp_path))
    await stack.add_gateway("g", capacity=4, delay_s=0.01)
    task_file = tmp_path / "TASK.yaml"
    task_file.write_text(
        "task_id: cli-task\ninstruction: say hi\nnum_samples: 2\ntimeout_seconds: 30\n"
        "harness: {name: claude-code}\nruntime: {kind: local}\nbuilder: {strategy: prefix-merge}\n"
        "evaluator: {strategy: none}\nmetadata: {dataset: demo}\n"
    )
    cmd = [sys.executable, "-c", "import sys; from polar_run.cli import main; main(sys.argv[1:])"]
    common = ["--server", stack.target, "--token", TOKEN]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cmd, *args, *common], capture_output=True, text=True, timeout=60, cwd=Path.cwd())

    submitted = await asyncio.to_thread(run, "submit", str(task_file), "--watch")
    assert submitted.returncode == 0, submitted.stderr
    assert "task cli-task" in submitted.stdout
    assert submitted.stdout.count("resolved") == 2
    status = await asyncio.to_thread(run, "status", "cli-task", "--json")
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    assert data["task"]["status"] == "TASK_STATUS_COMPLETED"
    assert data["task"]["task"]["builder"]["strategy"] == "RECONSTRUCTION_STRATEGY_PREFIX_MERGE"
    listing = await asyncio.to_thread(run, "status")
    assert "cli-task" in listing.stdout
    refused = await asyncio.to_thread(
        lambda: subprocess.run([*cmd, "status", "--server", stack.target], capture_output=True, text=True, timeout=60)
    )
    assert refused.returncode == 1
    assert "UNAUTHENTICATED" in refused.stderr
