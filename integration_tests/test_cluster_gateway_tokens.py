"""``polar cluster`` with ``cluster.gateway_token_key`` on a real (private) Slurm: per-gateway tokens end to end.

A rollout server (SQLite state) and two gateways as Slurm jobs. ``up`` submits each gateway's job held, writes
the token of its gateway id ``gateway-<n>-j<job>`` and releases it; the rollout server requires gateway tokens.
Both gateways register (``up`` waits for the rollout server to list them), and the first one's token cannot act
as the second.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from polar.rollout.v1 import rollout_service_pb2 as pb
from polar.rollout.v1 import rollout_service_pb2_grpc as pb_grpc

from integration_tests.support.services import POLAR_ARGV, free_port
from integration_tests.support.slurm import PrivateSlurm, private_slurm, slurm_missing
from polar_core.channels import open_channel

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def slurm() -> Iterator[PrivateSlurm]:
    reason = slurm_missing()
    if reason is not None:
        pytest.skip(reason)
    with private_slurm(nodes=2, cpus=4, memory_mb=4000) as cluster:
        yield cluster


async def test_cluster_gateways_register_with_their_own_tokens(slurm: PrivateSlurm, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")} | slurm.env
    env["no_proxy"] = env["NO_PROXY"] = "*"
    key = tmp_path / "gateway.key"
    argv = [*POLAR_ARGV, "token", "key", "--out", str(key)]
    made = await asyncio.to_thread(subprocess.run, argv, env=env, capture_output=True, check=False)
    assert made.returncode == 0, made.stderr
    topology = tmp_path / "tok.toml"
    topology.write_text(f"""\
[cluster]
name = "tok"
partition = "{slurm.partition}"
time_limit = "00:30:00"
state_dsn = "sqlite:///{tmp_path}/rollout.sqlite3"
bind_host = "127.0.0.1"
advertise_host = "127.0.0.1"
workdir = "{REPO}"
ready_timeout_s = 240
gateway_token_key = "gateway.key"

[roles.rollout]
port = {free_port()}
settings = {{ heartbeat_interval_s = 0.5, metrics_port = -1 }}

[roles.gateway]
count = 2
drain_s = 5
settings = {{ metrics_port = -1, dependency_probes = false }}
""")
    state = tmp_path / "tok.cluster"

    def cluster(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [*POLAR_ARGV, "cluster", "--topology", str(topology), *args]
        return subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)

    def logs() -> str:
        return "\n".join(
            f"===== {log.name} =====\n{log.read_text(errors='replace')[-1500:]}"
            for log in sorted((state / "logs").glob("*.log"))
        )

    try:
        up = await asyncio.to_thread(cluster, "up")
        assert up.returncode == 0, f"{up.stdout}\n{up.stderr}\n{logs()}"
        rollout = (state / "run" / "rollout-1.address").read_text().strip()
        admin = (state / "secrets" / "admin").read_text().strip()
        async with open_channel(rollout, auth_token=admin) as channel:
            reply = await pb_grpc.RolloutServiceStub(channel).ListGateways(pb.ListGatewaysRequest(), timeout=10)
        ids = sorted(g.gateway_id for g in reply.gateways if g.live)
        assert [i.split("-j")[0] for i in ids] == ["gateway-1", "gateway-2"], ids
        tokens = {i: (state / "secrets" / f"{i.replace('-j', '.j', 1)}.gateway_token").read_text().strip() for i in ids}
        scripts = "\n".join(p.read_text() for p in (state / "scripts").glob("*.sbatch"))
        assert all(token not in scripts for token in tokens.values())
        assert key.read_text().strip() not in scripts
        # The first gateway's token, used as the second: refused, naming the token's gateway.
        first, second = ids
        async with open_channel(rollout, auth_token=tokens[first]) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await pb_grpc.RolloutServiceStub(channel).Heartbeat(pb.HeartbeatRequest(gateway_id=second), timeout=10)
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert f"token is for gateway '{first}'" in (info.value.details() or "")
        # The shared gateway token is not taken for gateway calls there.
        shared = (state / "secrets" / "gateway").read_text().strip()
        async with open_channel(rollout, auth_token=shared) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await pb_grpc.RolloutServiceStub(channel).Heartbeat(pb.HeartbeatRequest(gateway_id=first), timeout=10)
        assert info.value.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED)
    finally:
        down = await asyncio.to_thread(cluster, "down")
        assert down.returncode == 0, f"{down.stdout}\n{down.stderr}\n{logs()}"
