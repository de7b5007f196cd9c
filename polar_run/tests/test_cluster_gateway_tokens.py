"""``polar cluster`` with ``cluster.gateway_token_key``: each gateway job gets a token for its own gateway id."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from polar_core.errors import InvalidArgument
from polar_core.gateway_tokens import GatewayTokenVerifier, load_signing_key, new_signing_key
from polar_run.cluster.launcher import ClusterLauncher
from polar_run.cluster.scripts import render_script
from polar_run.cluster.slurm import JobView, Slurm
from polar_run.cluster.topology import PartitionInfo, load_topology

TOPOLOGY = """
[cluster]
name = "t"
partition = "debug"
time_limit = "04:00:00"
state_dsn = "sqlite:////tmp/never-opened.sqlite3"
gateway_token_key = "gateway.key"
[roles.rollout]
[roles.gateway]
count = 2
"""


class HoldingSlurm(Slurm):
    """Jobs in memory; records holds and releases, and whether each job's token existed when it was released."""

    def __init__(self, token_file: object) -> None:
        super().__init__()
        self.queue: dict[str, JobView] = {}
        self.held: set[str] = set()
        self.released: list[tuple[str, bool]] = []
        self._token_file = token_file
        self._next = 200

    def partition(self, name: str) -> PartitionInfo | None:
        return PartitionInfo(name=name, nodes=3, cpus_per_node=4, mem_mb_per_node=4000, max_time_s=None)

    def submit(self, script: Path, *, hold: bool = False) -> str:
        self._next += 1
        job = str(self._next)
        self.queue[job] = JobView(job, script.stem, "PENDING" if hold else "RUNNING", "", "JobHeldUser")
        if hold:
            self.held.add(job)
        return job

    def release(self, job_ids: list[str]) -> None:  # type: ignore[override]
        for job in job_ids:
            self.held.discard(job)
            slot = self.queue[job].name
            self.released.append((job, self._token_file(slot, job).exists()))  # type: ignore[operator]

    def jobs(self) -> dict[str, JobView]:
        return dict(self.queue)


def _topology(tmp_path: Path, text: str = TOPOLOGY, *, key: str | None = None, mode: int = 0o600) -> Path:
    key_file = tmp_path / "gateway.key"
    key_file.write_text(key if key is not None else new_signing_key())
    key_file.chmod(mode)
    path = tmp_path / "t.toml"
    path.write_text(text)
    return path


def test_each_gateway_job_is_released_only_with_a_token_for_its_own_id(tmp_path: Path) -> None:
    path = _topology(tmp_path)
    run = ClusterLauncher(path, slurm=Slurm(), say=lambda _: None)
    slurm = HoldingSlurm(run.state.gateway_token_file)
    run.slurm = slurm
    run.state.write_secrets(run.topology)
    with run.state.edit() as st:
        st.counts = {"rollout": 1, "gateway": 2}
        rollout = run._reconcile(st, slurm.jobs(), ("rollout",), retry_failed=True)
        gateways = run._reconcile(st, slurm.jobs(), ("gateway",), retry_failed=True)
    assert [slot for slot, _ in rollout] == ["rollout-1"]
    assert [slot for slot, _ in gateways] == ["gateway-1", "gateway-2"]
    # The rollout server's job is not held; each gateway's was, and was released once its token was written.
    assert slurm.held == set()
    assert slurm.released == [(job, True) for _, job in gateways]
    verifier = GatewayTokenVerifier(load_signing_key(tmp_path / "gateway.key"))
    for slot, job in gateways:
        file = run.state.gateway_token_file(slot, job)
        assert file.stat().st_mode & 0o077 == 0
        claims = verifier.verify(file.read_text().strip())
        assert claims.gateway_id == f"{slot}-j{job}"
        # Default lifetime: the gateway's time limit (4 h) plus two days in the queue.
        assert claims.expires_at - claims.issued_at == 4 * 3600 + 2 * 86400


def test_scripts_wire_the_key_to_the_rollout_server_and_each_token_to_its_gateway(tmp_path: Path) -> None:
    path = _topology(tmp_path)
    topology = load_topology(path)
    run = ClusterLauncher(path, slurm=Slurm(), say=lambda _: None)
    run.state.write_secrets(topology)
    rollout = render_script(topology, run.state, "rollout", 1)
    assert f"export POLAR_ROLLOUT_GATEWAY_TOKEN_KEY_FILE={tmp_path / 'gateway.key'}" in rollout
    assert "export POLAR_ROLLOUT_REQUIRE_GATEWAY_TOKENS=true" in rollout
    assert "POLAR_ROLLOUT_GATEWAY_TOKEN=" not in rollout  # no shared gateway token where it grants nothing
    gateway = render_script(topology, run.state, "gateway", 1)
    own = '"$STATE/secrets/$SLOT.j$SLURM_JOB_ID.gateway_token"'
    assert f'export POLAR_GATEWAY_IDENTITY_TOKEN="$(< {own})"' in gateway
    assert f"[ -s {own} ] || fail" in gateway
    assert 'POLAR_GATEWAY_GATEWAY_ID="$SLOT-j$SLURM_JOB_ID"' in gateway
    # The shared gateway token still reaches the gateway (for the proxy, reconstructor and evaluator).
    assert '"$(< "$STATE/secrets/gateway")"' in gateway
    key = (tmp_path / "gateway.key").read_text().strip()
    for script in (rollout, gateway):
        assert key not in script
        if shutil.which("bash"):
            file = tmp_path / "check.sbatch"
            file.write_text(script)
            assert subprocess.run(["bash", "-n", str(file)], check=False).returncode == 0


def test_without_a_key_nothing_changes(tmp_path: Path) -> None:
    path = _topology(tmp_path, TOPOLOGY.replace('gateway_token_key = "gateway.key"\n', ""))
    topology = load_topology(path)
    run = ClusterLauncher(path, slurm=Slurm(), say=lambda _: None)
    run.state.write_secrets(topology)
    rollout = render_script(topology, run.state, "rollout", 1)
    assert "GATEWAY_TOKEN_KEY_FILE" not in rollout
    assert 'POLAR_ROLLOUT_GATEWAY_TOKEN="$(< "$STATE/secrets/gateway")"' in rollout
    assert "IDENTITY_TOKEN" not in render_script(topology, run.state, "gateway", 1)


@pytest.mark.parametrize(
    ("key", "mode", "ttl", "refusal"),
    [
        (None, 0o644, "", "cluster.gateway_token_key: .* is readable by others"),
        ("short", 0o600, "", "cluster.gateway_token_key: .*at least 32"),
        (None, 0o600, "forever", "cluster.gateway_token_ttl"),
    ],
)
def test_a_bad_key_or_lifetime_is_refused_before_anything_is_submitted(
    tmp_path: Path, key: str | None, mode: int, ttl: str, refusal: str
) -> None:
    text = TOPOLOGY.replace("[roles.rollout]", f'gateway_token_ttl = "{ttl}"\n[roles.rollout]') if ttl else TOPOLOGY
    with pytest.raises(InvalidArgument, match=refusal):
        load_topology(_topology(tmp_path, text, key=key, mode=mode))


def test_an_explicit_lifetime_is_used(tmp_path: Path) -> None:
    text = TOPOLOGY.replace("[roles.rollout]", 'gateway_token_ttl = "3d"\n[roles.rollout]')
    assert load_topology(_topology(tmp_path, text)).gateway_token_ttl_s() == 3 * 86400
