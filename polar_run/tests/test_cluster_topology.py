"""The topology file of ``polar cluster``: every refusal comes before any job and names the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from polar_core.errors import InvalidArgument
from polar_run.cluster.topology import (
    PartitionInfo,
    check_against_partition,
    load_topology,
    parse_time_limit,
    role_counts,
)

GOOD = """
[cluster]
name = "demo"
partition = "debug"
time_limit = "01:00:00"
state_dsn = "postgresql://polar@db:5432/polar"

[roles.rollout]
[roles.proxy]
[roles.gateway]
count = 3
cpus = 2
mem_mb = 2000
drain_s = 120
"""

PARTITION = PartitionInfo(name="debug", nodes=3, cpus_per_node=4, mem_mb_per_node=4000, max_time_s=7200)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "topology.toml"
    path.write_text(text)
    return path


def refused(tmp_path: Path, text: str) -> str:
    with pytest.raises(InvalidArgument) as info:
        load_topology(write(tmp_path, text))
    return info.value.message


def test_a_good_topology_loads(tmp_path: Path) -> None:
    topology = load_topology(write(tmp_path, GOOD))
    assert role_counts(topology) == {"rollout": 1, "proxy": 1, "reconstructor": 0, "evaluator": 0, "gateway": 3}
    assert topology.port("rollout", 1) == 50051
    assert topology.port("proxy", 2) == 50054
    assert topology.port("gateway", 3) == 0  # each gateway binds a free port and registers it
    check_against_partition(topology, PARTITION)


def test_unknown_role_is_refused(tmp_path: Path) -> None:
    message = refused(tmp_path, GOOD + "\n[roles.gatway]\ncount = 1\n")
    assert "roles" in message
    assert "unknown role 'gatway'" in message


def test_missing_state_dsn_is_refused(tmp_path: Path) -> None:
    message = refused(tmp_path, GOOD.replace('state_dsn = "postgresql://polar@db:5432/polar"\n', ""))
    assert "cluster.state_dsn" in message


def test_blank_or_foreign_state_dsn_is_refused(tmp_path: Path) -> None:
    assert "cluster.state_dsn" in refused(tmp_path, GOOD.replace("postgresql://polar@db:5432/polar", " "))
    assert "cluster.state_dsn" in refused(tmp_path, GOOD.replace("postgresql://polar@db:5432/polar", "mysql://x"))


def test_unknown_keys_and_bad_values_name_their_field(tmp_path: Path) -> None:
    assert "roles.gateway.cpu" in refused(tmp_path, GOOD.replace("cpus = 2", "cpu = 2"))
    assert "roles.gateway.count" in refused(tmp_path, GOOD.replace("count = 3", "count = -1"))
    assert "cluster.time_limit" in refused(tmp_path, GOOD.replace('"01:00:00"', '"an hour"'))
    assert "cluster.name" in refused(tmp_path, GOOD.replace('name = "demo"', 'name = "a b"'))


def test_exactly_one_rollout_server(tmp_path: Path) -> None:
    assert "exactly one rollout server" in refused(
        tmp_path, GOOD.replace("[roles.rollout]", "[roles.rollout]\ncount = 2")
    )
    assert "exactly one rollout server" in refused(tmp_path, GOOD.replace("[roles.rollout]\n", ""))


def test_credentials_never_in_settings(tmp_path: Path) -> None:
    text = GOOD.replace("drain_s = 120", 'drain_s = 120\nsettings = { gateway_token = "x" }')
    assert "roles.gateway.settings" in refused(tmp_path, text)


def test_drain_must_fit_in_the_time_limit(tmp_path: Path) -> None:
    assert "roles.gateway.drain_s" in refused(tmp_path, GOOD.replace("drain_s = 120", "drain_s = 3600"))


def test_token_files_must_be_private(tmp_path: Path) -> None:
    token = tmp_path / "admin.token"
    token.write_text("secret")
    token.chmod(0o644)
    text = GOOD + '\n[tokens]\nadmin = "admin.token"\n'
    message = refused(tmp_path, text)
    assert "tokens.admin" in message
    assert "chmod 600" in message
    token.chmod(0o600)
    assert load_topology(write(tmp_path, text)).tokens == {"admin": "admin.token"}
    assert "tokens.admin" in refused(tmp_path, text.replace("admin.token", "missing.token"))
    assert "tokens: unknown token role 'root'" in refused(tmp_path, GOOD + '\n[tokens]\nroot = "admin.token"\n')


def test_more_than_the_partition_offers_is_refused(tmp_path: Path) -> None:
    topology = load_topology(write(tmp_path, GOOD))
    with pytest.raises(InvalidArgument, match=r"roles\.gateway\.cpus"):
        check_against_partition(topology, PARTITION.model_copy(update={"cpus_per_node": 1}))
    with pytest.raises(InvalidArgument, match=r"roles\.gateway\.mem_mb"):
        check_against_partition(topology, PARTITION.model_copy(update={"mem_mb_per_node": 1500}))
    with pytest.raises(InvalidArgument, match=r"cluster\.time_limit"):
        check_against_partition(topology, PARTITION.model_copy(update={"max_time_s": 1800}))
    with pytest.raises(InvalidArgument, match=r"roles: the fleet needs 14 CPUs"):
        check_against_partition(topology, PARTITION, {"gateway": 6})
    with pytest.raises(InvalidArgument, match=r"cluster\.partition"):
        check_against_partition(topology, None)


def test_slurm_time_limits() -> None:
    assert parse_time_limit("30") == 1800
    assert parse_time_limit("1:30") == 90
    assert parse_time_limit("04:00:00") == 4 * 3600
    assert parse_time_limit("1-00") == 86400
    assert parse_time_limit("2-01:00:05") == 2 * 86400 + 3605
    for bad in ("", "0", "an hour"):
        with pytest.raises(ValueError, match="time limit"):
            parse_time_limit(bad)
