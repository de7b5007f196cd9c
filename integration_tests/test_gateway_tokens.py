"""Per-gateway tokens without mTLS: a real rollout server and real gateways, each ``polar serve`` processes.

The operator makes a signing key and issues one token per gateway with ``polar token key`` / ``polar token
issue``. The rollout server holds the key and requires gateway tokens (``require_gateway_tokens``): the shared
gateway token no longer registers anyone. Two gateways register with their own tokens (``identity_token``, the
gateway id taken from the token). Then:

* gateway A's token used to register, heartbeat, drain or report as gateway B is PERMISSION_DENIED, naming the
  token's gateway;
* an expired token is UNAUTHENTICATED saying when it expired; a gateway given one refuses to start;
* a token signed with another key is UNAUTHENTICATED (a gateway process holding one never registers);
* the right token works, and the admin token may still drain any gateway.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from polar.rollout.v1 import rollout_service_pb2 as pb
from polar.rollout.v1 import rollout_service_pb2_grpc as pb_grpc

from integration_tests.support.services import POLAR_ARGV, ServiceProcesses, free_port
from polar_core.channels import open_channel
from polar_core.gateway_tokens import issue_gateway_token, load_signing_key

TRAINER = "trainer-" + "51c0a7e2d9b34f86"
ADMIN = "admin-" + "0b8e6f4a2c9d7153"
SHARED_GATEWAY = "gateway-" + "a4d2c8e06f1b9375"
INTERNAL = "internal-" + "6e3f9b1d0c7a2845"


def _polar(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*POLAR_ARGV, *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin"},
    )


async def _call(target: str, token: str, method: str, request: Any) -> tuple[grpc.StatusCode, str]:
    async with open_channel(target, auth_token=token) as channel:
        try:
            await getattr(pb_grpc.RolloutServiceStub(channel), method)(request, timeout=10)
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


class Fleet:
    processes: ServiceProcesses
    rollout: str
    key: Path
    tokens: dict[str, str]

    async def gateways(self) -> dict[str, pb.GatewayInfo]:
        async with open_channel(self.rollout, auth_token=ADMIN) as channel:
            reply = await pb_grpc.RolloutServiceStub(channel).ListGateways(pb.ListGatewaysRequest(), timeout=10)
        return {g.gateway_id: g for g in reply.gateways}


def _gateway_env(rollout: str, token: str) -> dict[str, str]:
    return {
        "POLAR_GATEWAY_IDENTITY_TOKEN": token,
        "POLAR_GATEWAY_GATEWAY_TOKEN": SHARED_GATEWAY,  # for proxy, reconstructor and evaluator (none here)
        "POLAR_GATEWAY_ROLLOUT_ADDRESS": rollout,
        "POLAR_GATEWAY_METRICS_PORT": "-1",
        "POLAR_GATEWAY_DEPENDENCY_PROBES": "false",
    }


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    f = Fleet()
    f.key = tmp_path / "gateway-token.key"
    made = _polar("token", "key", "--out", str(f.key), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert f.key.stat().st_mode & 0o077 == 0
    f.tokens = {}
    for gateway in ("gw-a", "gw-b"):
        out = tmp_path / f"{gateway}.token"
        issued = _polar(
            "token", "issue", "--gateway-id", gateway, "--ttl", "1h", "--key-file", str(f.key), "--out", str(out),
            cwd=tmp_path,
        )  # fmt: skip
        assert issued.returncode == 0, issued.stderr
        assert f"gateway {gateway}, issued" in issued.stderr
        f.tokens[gateway] = out.read_text().strip()
    f.processes = ServiceProcesses(tmp_path)
    port = free_port()
    f.rollout = f"127.0.0.1:{port}"
    rollout_env = {
        "POLAR_ROLLOUT_TRAINER_TOKEN": TRAINER,
        "POLAR_ROLLOUT_ADMIN_TOKEN": ADMIN,
        "POLAR_ROLLOUT_GATEWAY_TOKEN": SHARED_GATEWAY,
        "POLAR_ROLLOUT_INTERNAL_TOKEN": INTERNAL,
        "POLAR_ROLLOUT_GATEWAY_TOKEN_KEY_FILE": str(f.key),
        "POLAR_ROLLOUT_REQUIRE_GATEWAY_TOKENS": "true",
        "POLAR_ROLLOUT_HEARTBEAT_INTERVAL_S": "0.3",
    }
    f.processes.serve("rollout", "rollout", "127.0.0.1", port, rollout_env)
    for gateway in ("gw-a", "gw-b"):
        f.processes.serve(gateway, "gateway", "127.0.0.1", free_port(), _gateway_env(f.rollout, f.tokens[gateway]))
    try:
        await f.processes.wait_healthy(["rollout", "gw-a", "gw-b"])
        deadline = time.monotonic() + 60
        while set(await f.gateways()) != {"gw-a", "gw-b"}:
            assert time.monotonic() < deadline, f"the gateways did not register\n{f.processes.logs()}"
            await asyncio.sleep(0.2)
        yield f
    finally:
        f.processes.kill_all()


async def test_a_gateway_token_acts_only_as_its_own_gateway(fleet: Fleet) -> None:
    ok, denied = grpc.StatusCode.OK, grpc.StatusCode.PERMISSION_DENIED
    token_a = fleet.tokens["gw-a"]
    pool = await fleet.gateways()
    assert all(g.live for g in pool.values()), pool

    # A's token, as itself: heartbeats work (the gateway process itself registered with it).
    assert await _call(fleet.rollout, token_a, "Heartbeat", pb.HeartbeatRequest(gateway_id="gw-a", capacity=1)) == (
        ok,
        "",
    )
    # A's token as B: every gateway RPC is refused, naming the token's gateway.
    forged_report = pb.ReportSessionResultRequest()
    forged_report.result.session_id, forged_report.result.gateway_id = "s-1", "gw-b"
    as_b = {
        "RegisterGateway": pb.RegisterGatewayRequest(gateway_id="gw-b", address="127.0.0.1:1", capacity=8),
        "Heartbeat": pb.HeartbeatRequest(gateway_id="gw-b", capacity=8),
        "DrainGateway": pb.DrainGatewayRequest(gateway_id="gw-b"),
        "ReportSessionResult": forged_report,
    }
    for method, request in as_b.items():
        code, message = await _call(fleet.rollout, token_a, method, request)
        assert code == denied, (method, code, message)
        assert f"{method} for gateway 'gw-b' refused: the caller's gateway token is for gateway 'gw-a'" in message
        assert token_a not in message
    # B was left alone: still registered at its own address, live and not draining.
    b = (await fleet.gateways())["gw-b"]
    assert b.live
    assert not b.draining
    assert b.address != "127.0.0.1:1"

    # A report as itself gets past authentication (the session is unknown: NOT_FOUND, not a refusal).
    own_report = pb.ReportSessionResultRequest()
    own_report.result.session_id, own_report.result.gateway_id = "s-1", "gw-a"
    code, _ = await _call(fleet.rollout, token_a, "ReportSessionResult", own_report)
    assert code not in (denied, grpc.StatusCode.UNAUTHENTICATED)

    # The shared gateway token no longer makes gateway calls here; the admin token may still drain any gateway.
    code, message = await _call(fleet.rollout, SHARED_GATEWAY, "Heartbeat", pb.HeartbeatRequest(gateway_id="gw-b"))
    assert code == denied
    assert "only with a per-gateway token" in message
    assert (await _call(fleet.rollout, ADMIN, "DrainGateway", pb.DrainGatewayRequest(gateway_id="gw-b")))[0] == ok
    # A gateway token is no trainer.
    assert (await _call(fleet.rollout, token_a, "ListTasks", pb.ListTasksRequest()))[0] == denied


async def test_expired_and_foreign_gateway_tokens_are_refused_with_the_reason(fleet: Fleet, tmp_path: Path) -> None:
    unauthenticated = grpc.StatusCode.UNAUTHENTICATED
    key = load_signing_key(fleet.key)
    expired = issue_gateway_token(key, "gw-c", ttl_s=60, now=time.time() - 3600)
    register_c = pb.RegisterGatewayRequest(gateway_id="gw-c", address="127.0.0.1:3", capacity=1)
    code, message = await _call(fleet.rollout, expired, "RegisterGateway", register_c)
    assert code == unauthenticated
    assert "gateway token for gw-c expired at " in message
    # A gateway given an expired token says so and does not start.
    started = await asyncio.to_thread(
        subprocess.run,
        [*POLAR_ARGV, "serve", "gateway", "--state-dir", str(tmp_path / "gw-c"), "--port", "0", "--check"],
        env={"PATH": "/usr/bin:/bin", **_gateway_env(fleet.rollout, expired)},
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert started.returncode != 0
    assert "has expired" in started.stderr, started.stderr

    # Signed with another key: refused, and a gateway process holding it never joins the pool.
    other_key = tmp_path / "other.key"
    other_key.write_text("x" * 64)
    foreign = issue_gateway_token(load_signing_key(other_key), "gw-d", ttl_s=3600)
    register_d = pb.RegisterGatewayRequest(gateway_id="gw-d", address="127.0.0.1:4", capacity=1)
    code, message = await _call(fleet.rollout, foreign, "RegisterGateway", register_d)
    assert code == unauthenticated
    assert "signature does not match" in message
    fleet.processes.serve("gw-d", "gateway", "127.0.0.1", free_port(), _gateway_env(fleet.rollout, foreign))
    await fleet.processes.wait_healthy(["gw-d"])
    log = fleet.processes.services["gw-d"].log
    deadline = time.monotonic() + 60
    while "signature does not match" not in log.read_text(errors="replace"):
        assert time.monotonic() < deadline, fleet.processes.logs()
        await asyncio.sleep(0.2)
    assert "gw-d" not in await fleet.gateways()
