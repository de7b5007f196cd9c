"""The topology file of ``polar cluster``: which roles run, how many of each, with what resources, on which partition.

A TOML file, typed and validated here before anything is submitted; every refusal names the field::

    [cluster]
    name = "demo"                       # job names are polar-demo-<role>-<slot>
    partition = "debug"
    account = ""                        # optional (sbatch --account)
    time_limit = "04:00:00"             # each job's limit (sbatch --time)
    state_dsn = "postgresql://polar@db:5432/polar"   # the rollout server's store (required)
    bind_host = "0.0.0.0"               # what every role listens on
    advertise_host = ""                 # what others dial; empty: each node's `hostname -f`
    polar = ""                          # the command that runs polar on the nodes; empty: this Python
    gateway_token_key = ""              # optional: signing key of per-gateway tokens (polar token key, 0600);
    gateway_token_ttl = ""              # each gateway job then gets its own token (default: time limit + 2d)

    [tokens]                            # optional: files holding the role tokens (mode 0600); missing ones
    trainer = "secrets/trainer"         # are generated in the state directory
    admin = "secrets/admin"

    [roles.rollout]
    port = 50051
    [roles.proxy]
    port = 50053
    http_port = 8000
    settings = { backend = "vllm", model = "/models/policy", backend_options = { url = "http://127.0.0.1:8001" } }
    [roles.gateway]
    count = 8
    cpus = 16
    mem_mb = 32000
    drain_s = 300                       # SIGUSR1 this long (+30 s) before the time limit; then it drains

Roles: ``rollout`` (exactly one), ``proxy``, ``reconstructor``, ``evaluator`` and ``gateway``; each instance is one
Slurm job. ``settings`` are the role's service settings (``POLAR_<SVC>_<FIELD>``, ``docs/deploy.md``); tokens and
the state DSN never go there. With ``gateway_token_key``, each gateway job is submitted held, given a token for its
own gateway id (``<slot>-j<job>``) and released; the rollout server requires such tokens (``docs/security.md``,
"Gateway tokens"). ``image`` runs the role in an Apptainer image (accepted; untested here: Apptainer is
not installable on the machines the tests run on).
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from polar_core.errors import InvalidArgument
from polar_core.gateway_tokens import load_signing_key, parse_ttl

__all__ = [
    "ROLES",
    "TOKEN_ROLES",
    "ClusterSpec",
    "PartitionInfo",
    "RoleSpec",
    "Topology",
    "check_against_partition",
    "load_topology",
    "parse_time_limit",
    "role_counts",
]

ROLES = ("rollout", "proxy", "reconstructor", "evaluator", "gateway")
TOKEN_ROLES = ("trainer", "gateway", "internal", "admin")

_DEFAULT_PORTS = {"rollout": 50051, "gateway": 0, "proxy": 50053, "reconstructor": 50054, "evaluator": 50055}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,40}$")
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ClusterSpec(_Strict):
    """The ``[cluster]`` table: where and how long the jobs run, and the state every rollout server shares."""

    name: str = "polar"
    partition: str
    account: str = ""
    time_limit: str = "04:00:00"
    state_dsn: str
    bind_host: str = "0.0.0.0"
    advertise_host: str = ""
    polar: str = ""
    workdir: str = ""
    ready_timeout_s: float = Field(default=600.0, gt=0)
    gateway_token_key: str = ""
    gateway_token_ttl: str = ""

    @field_validator("gateway_token_ttl")
    @classmethod
    def _ttl(cls, value: str) -> str:
        if value:
            try:
                parse_ttl(value)
            except InvalidArgument as exc:
                raise ValueError(exc.message) from None
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("letters, digits, '-' and '_' only (at most 41), starting with a letter or digit")
        return value

    @field_validator("time_limit")
    @classmethod
    def _time(cls, value: str) -> str:
        parse_time_limit(value)
        return value

    @field_validator("state_dsn")
    @classmethod
    def _dsn(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the rollout server's state DSN is required (postgresql://... or sqlite:///PATH)")
        if not value.startswith(("postgresql://", "postgres://", "sqlite:///")):
            raise ValueError("must be postgresql://... or sqlite:///PATH")
        return value


class RoleSpec(_Strict):
    """One ``[roles.<role>]`` table: how many instances, each one Slurm job with these resources."""

    count: int = Field(default=1, ge=0)
    cpus: int = Field(default=1, ge=1)
    mem_mb: int = Field(default=1024, ge=1)
    port: int | None = Field(default=None, ge=0, le=65535)
    http_port: int = Field(default=8000, ge=1, le=65535)
    nodelist: str = ""
    time_limit: str = ""
    drain_s: int = Field(default=120, ge=0)
    image: str = ""
    settings: dict[str, Any] = Field(default_factory=dict)

    @field_validator("time_limit")
    @classmethod
    def _time(cls, value: str) -> str:
        if value:
            parse_time_limit(value)
        return value

    @field_validator("settings")
    @classmethod
    def _no_secrets(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if key.endswith("token") or key in ("store_url",):
                raise ValueError(f"{key!r} is a credential: tokens go in [tokens], the DSN in cluster.state_dsn")
        return value


class Topology(_Strict):
    """A whole topology file."""

    cluster: ClusterSpec
    tokens: dict[str, str] = Field(default_factory=dict)
    roles: dict[str, RoleSpec]

    @field_validator("tokens")
    @classmethod
    def _token_roles(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if key not in TOKEN_ROLES:
                raise ValueError(f"unknown token role {key!r}; choose from {', '.join(TOKEN_ROLES)}")
        return value

    @field_validator("roles")
    @classmethod
    def _known_roles(cls, value: dict[str, RoleSpec]) -> dict[str, RoleSpec]:
        for key in value:
            if key not in ROLES:
                raise ValueError(f"unknown role {key!r}; choose from {', '.join(ROLES)}")
        rollout = value.get("rollout")
        if rollout is None or rollout.count != 1:
            raise ValueError("exactly one rollout server is needed ([roles.rollout] with count = 1)")
        return value

    def role(self, name: str) -> RoleSpec:
        """The role's table (a role absent from the file runs no instance)."""
        return self.roles.get(name, RoleSpec(count=0))

    def port(self, role: str, slot: int) -> int:
        """The gRPC port of instance ``slot`` (from 1) of ``role``: the role's port plus ``slot - 1`` (gateways: 0,
        a free port each; they register the one they bound)."""
        base = self.role(role).port
        base = _DEFAULT_PORTS[role] if base is None else base
        return 0 if base == 0 else base + slot - 1

    def time_limit(self, role: str) -> str:
        """The role's job time limit (its own, else the cluster's)."""
        return self.role(role).time_limit or self.cluster.time_limit

    def gateway_token_ttl_s(self) -> int:
        """Lifetime of each gateway job's token: ``gateway_token_ttl``, else the gateway's time limit plus two days
        (a job may wait in the queue after its token is issued)."""
        if self.cluster.gateway_token_ttl:
            return parse_ttl(self.cluster.gateway_token_ttl)
        return parse_time_limit(self.time_limit("gateway")) + 2 * 86400


def parse_time_limit(value: str) -> int:
    """Seconds in a Slurm time limit (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``)."""
    match = _TIME.match(value.strip())
    if match is None:
        raise ValueError(f"{value!r} is not a Slurm time limit (e.g. 04:00:00 or 1-00:00:00)")
    days, first, second, third = (int(g) if g else None for g in match.groups())
    if days is not None:
        hours, minutes, seconds = first or 0, second or 0, third or 0
    elif third is not None:
        hours, minutes, seconds = first or 0, second or 0, third
    else:
        hours, minutes, seconds = 0, first or 0, second or 0
    total = (days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise ValueError(f"{value!r}: a time limit must be positive")
    return total


def _field(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(file)"


def load_topology(path: Path) -> Topology:
    """Read and validate a topology file, and check that its token files are private.

    Raises:
        InvalidArgument: The file is unreadable or malformed; the message names the field.
    """
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise InvalidArgument(f"topology {path}: cannot read it: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument(f"topology {path}: not valid TOML: {exc}") from None
    try:
        topology = Topology.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{_field(e['loc'])}: {e['msg'].removeprefix('Value error, ')}" for e in exc.errors())
        raise InvalidArgument(f"topology {path}: {problems}") from None
    for role, file in topology.tokens.items():
        _check_token_file(path.parent, f"tokens.{role}", file)
    if topology.cluster.gateway_token_key:
        key = _check_token_file(path.parent, "cluster.gateway_token_key", topology.cluster.gateway_token_key)
        try:
            load_signing_key(key)
        except InvalidArgument as exc:
            raise InvalidArgument(f"cluster.gateway_token_key: {exc.message}") from None
    gateway = topology.role("gateway")
    limit = parse_time_limit(topology.time_limit("gateway"))
    if gateway.count and gateway.drain_s + 30 >= limit:
        raise InvalidArgument(
            f"topology {path}: roles.gateway.drain_s: {gateway.drain_s} s (+30 s) does not fit in the gateway's time "
            f"limit of {limit} s"
        )
    return topology


def _check_token_file(base: Path, field: str, file: str) -> Path:
    path = Path(file) if Path(file).is_absolute() else base / file
    try:
        info = path.stat()
    except OSError as exc:
        raise InvalidArgument(f"{field}: cannot read {path}: {exc.strerror}") from None
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise InvalidArgument(
            f"{field}: {path} is readable by others (mode {stat.S_IMODE(info.st_mode):04o}); chmod 600 it"
        )
    if info.st_uid != os.geteuid():
        raise InvalidArgument(f"{field}: {path} belongs to another user")
    if not path.read_text().strip():
        raise InvalidArgument(f"{field}: {path} is empty")
    return path


class PartitionInfo(BaseModel):
    """What ``sinfo`` says a partition offers."""

    model_config = ConfigDict(frozen=True)

    name: str
    nodes: int
    cpus_per_node: int
    mem_mb_per_node: int
    max_time_s: int | None
    """``None`` when the partition has no time limit."""


def check_against_partition(
    topology: Topology, partition: PartitionInfo | None, counts: Mapping[str, int] | None = None
) -> None:
    """Refuse a topology that asks for more than the partition offers (before anything is submitted).

    Raises:
        InvalidArgument: The partition is unknown, or a role's cpus, memory or time limit, or the fleet's total
            CPUs, exceed it; the message names the field.

    ``counts`` replaces the file's counts (``polar cluster scale``).
    """
    if partition is None:
        raise InvalidArgument(f"cluster.partition: Slurm has no partition {topology.cluster.partition!r}")
    total = 0
    for role in ROLES:
        spec = topology.role(role)
        count = spec.count if counts is None else counts.get(role, spec.count)
        if not count:
            continue
        if spec.cpus > partition.cpus_per_node:
            raise InvalidArgument(
                f"roles.{role}.cpus: {spec.cpus} CPUs per job, but the nodes of partition {partition.name!r} "
                f"have {partition.cpus_per_node}"
            )
        if spec.mem_mb > partition.mem_mb_per_node:
            raise InvalidArgument(
                f"roles.{role}.mem_mb: {spec.mem_mb} MB per job, but the nodes of partition {partition.name!r} "
                f"have {partition.mem_mb_per_node} MB"
            )
        limit = parse_time_limit(topology.time_limit(role))
        if partition.max_time_s is not None and limit > partition.max_time_s:
            field = f"roles.{role}.time_limit" if spec.time_limit else "cluster.time_limit"
            raise InvalidArgument(
                f"{field}: {limit} s, but partition {partition.name!r} allows at most {partition.max_time_s} s"
            )
        total += spec.cpus * count
    offered = partition.nodes * partition.cpus_per_node
    if total > offered:
        raise InvalidArgument(
            f"roles: the fleet needs {total} CPUs (count x cpus of every role), but partition {partition.name!r} "
            f"has {offered} ({partition.nodes} nodes x {partition.cpus_per_node})"
        )


def role_counts(topology: Topology) -> dict[str, int]:
    """Instances of every role the file asks for."""
    return {role: topology.role(role).count for role in ROLES}
