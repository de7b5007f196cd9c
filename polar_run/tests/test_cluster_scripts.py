"""The sbatch scripts ``polar cluster`` writes: readable, secret-free, valid bash, the right Slurm options."""

from __future__ import annotations

import shutil
import stat
import subprocess
import tomllib
from pathlib import Path

import pytest

from polar_run.cluster.scripts import job_name, peer_slot, render_script
from polar_run.cluster.state import StateDir
from polar_run.cluster.topology import Topology, load_topology

TOPOLOGY = """
[cluster]
name = "demo"
partition = "gpu"
account = "rl"
time_limit = "04:00:00"
state_dsn = "postgresql://polar:pw@db:5432/polar"
advertise_host = "10.0.0.5"

[tokens]
trainer = "trainer.token"

[roles.rollout]
settings = { lease_ttl_s = 30, gateway_addresses = [] }
[roles.proxy]
count = 2
http_port = 8000
settings = { backend = "vllm", backend_options = { url = "http://127.0.0.1:8001" }, fsync = false }
[roles.reconstructor]
[roles.evaluator]
[roles.gateway]
count = 3
cpus = 8
mem_mb = 16000
drain_s = 300
nodelist = "node[1-3]"
"""


@pytest.fixture
def setup(tmp_path: Path) -> tuple[StateDir, str]:
    token = tmp_path / "trainer.token"
    token.write_text("the-trainer-token")
    token.chmod(0o600)
    path = tmp_path / "demo.toml"
    path.write_text(TOPOLOGY)
    topology = load_topology(path)
    state = StateDir(path)
    state.write_secrets(topology)
    return state, TOPOLOGY


def render(state: StateDir, role: str, index: int) -> str:
    return render_script(load_topology(state.topology_file), state, role, index)


def test_gateway_script(setup: tuple[StateDir, str]) -> None:
    state, _ = setup
    script = render(state, "gateway", 2)
    assert "#SBATCH --job-name=polar-demo-gateway-2" in script
    assert "#SBATCH --partition=gpu" in script
    assert "#SBATCH --account=rl" in script
    assert "#SBATCH --time=04:00:00" in script
    assert "#SBATCH --cpus-per-task=8" in script
    assert "#SBATCH --mem=16000M" in script
    assert "#SBATCH --nodelist=node[1-3]" in script
    assert f"#SBATCH --output={state.logs}/gateway-2.j%j.log" in script
    # Signalled 330 s before its limit: 300 s to drain, 30 s to hand back and exit.
    assert "#SBATCH --signal=B:USR1@330" in script
    assert "POLAR_GATEWAY_DRAIN_TIMEOUT_S=300" in script
    assert 'POLAR_GATEWAY_GATEWAY_ID="$SLOT-j$SLURM_JOB_ID"' in script
    # It uses the second proxy (round robin) and checks the rollout server and the proxy before serving.
    assert "$(peer proxy-2)" in script
    assert 'reach "rollout server" "$ROLLOUT"' in script
    assert 'reach "model proxy" "$PROXY"' in script
    # Tokens come from files; the gateway only holds the internal token's digest.
    assert '"$(< "$STATE/secrets/gateway")"' in script
    assert '"$(< "$STATE/secrets/internal.sha256")"' in script
    assert script.rstrip().splitlines()[-1].startswith('exec "${POLAR[@]}" serve gateway')


def test_scripts_hold_no_secret_and_are_valid_bash(setup: tuple[StateDir, str]) -> None:
    state, _ = setup
    topology = load_topology(state.topology_file)
    secrets = [state.token(topology, role) for role in ("trainer", "gateway", "internal", "admin")]
    secrets.append("pw@db")
    for role, count in (("rollout", 1), ("proxy", 2), ("reconstructor", 1), ("evaluator", 1), ("gateway", 3)):
        for index in range(1, count + 1):
            script = render(state, role, index)
            assert all(secret not in script for secret in secrets), (role, index)
            if shutil.which("bash"):
                path = state.root / f"{role}-{index}.sbatch"
                path.write_text(script)
                done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
                assert done.returncode == 0, done.stderr
    rollout = render(state, "rollout", 1)
    assert '"$(< "$STATE/secrets/state_dsn")"' in rollout
    assert f'"$(< {state.root.parent}/trainer.token)"' in rollout  # the topology's own token file
    assert "export POLAR_ROLLOUT_LEASE_TTL_S=30" in rollout
    assert "export POLAR_ROLLOUT_GATEWAY_ADDRESSES='[]'" in rollout
    assert "--signal" not in rollout


def test_proxy_script_names_its_ports_and_public_url(setup: tuple[StateDir, str]) -> None:
    state, _ = setup
    script = render(state, "proxy", 2)
    assert "export POLAR_PROXY_HTTP_PORT=8001" in script
    assert 'export POLAR_PROXY_PUBLIC_BASE_URL="http://$ADVERTISE:8001"' in script
    assert "ADVERTISE=10.0.0.5" in script
    assert '--port "$PORT"' in script
    assert "PORT=50054" in script
    assert 'export POLAR_PROXY_BACKEND_OPTIONS=\'{"url": "http://127.0.0.1:8001"}\'' in script
    assert "export POLAR_PROXY_FSYNC=false" in script


def test_secrets_are_private(setup: tuple[StateDir, str]) -> None:
    state, _ = setup
    assert stat.S_IMODE(state.secrets.stat().st_mode) == 0o700
    for path in state.secrets.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert not (state.secrets / "trainer").exists()  # the topology names its own file
    assert state.token(load_topology(state.topology_file), "trainer") == "the-trainer-token"
    assert (state.secrets / "internal.sha256").read_text().startswith("sha256:")


def test_apptainer_image_is_accepted(setup: tuple[StateDir, str]) -> None:
    state, text = setup
    state.topology_file.write_text(text.replace('nodelist = "node[1-3]"', 'image = "/images/polar.sif"'))
    script = render(state, "gateway", 1)
    assert 'exec apptainer exec --bind "$STATE" /images/polar.sif polar serve gateway' in script


def test_names() -> None:
    topology = Topology.model_validate(tomllib.loads(TOPOLOGY.replace('[tokens]\ntrainer = "trainer.token"\n', "")))
    assert job_name(topology, "gateway-3") == "polar-demo-gateway-3"
    assert [peer_slot(topology, "proxy", i) for i in (1, 2, 3)] == ["proxy-1", "proxy-2", "proxy-1"]
    assert peer_slot(topology, "reconstructor", 3) == "reconstructor-1"
