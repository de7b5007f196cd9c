"""``polar cluster``'s state directory, next to the topology file (``demo.toml`` → ``demo.cluster/``)::

    state.json      wanted counts, each slot's current job and past jobs, jobs being retired, whether it is down
    scripts/        the generated sbatch scripts, one per slot (readable, keepable: ``sbatch`` them by hand)
    secrets/        (0700) role tokens and the state DSN, one 0600 file each, read by the jobs at start; with
                    ``cluster.gateway_token_key``, each gateway job's own token (``<slot>.j<job>.gateway_token``)
    logs/           each job's output, ``<role>-<slot>.j<job id>.log``
    run/            what jobs report: ``<slot>.j<job id>.address`` once serving, ``.failed`` with the reason
    data/           each slot's service state directory

The directory must be on a file system the compute nodes see (as a Slurm working directory usually is). Every
change to ``state.json`` happens under an exclusive lock (:meth:`ClusterState.edit`), so ``scale`` and ``down``
may run while ``supervise`` does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

from polar_run.cluster.topology import TOKEN_ROLES, Topology

__all__ = ["ClusterState", "Slot", "StateDir"]


@dataclasses.dataclass
class Slot:
    """One instance of a role: the job that runs it now and the jobs that ran it before."""

    role: str
    index: int
    job_id: str = ""
    past_jobs: list[str] = dataclasses.field(default_factory=list)
    failed: str = ""
    """Why its last job failed fast (it is not replaced until ``up`` or ``scale`` asks again)."""

    @property
    def name(self) -> str:
        """``<role>-<index>``."""
        return f"{self.role}-{self.index}"


@dataclasses.dataclass
class ClusterState:
    """What ``state.json`` holds."""

    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    slots: dict[str, Slot] = dataclasses.field(default_factory=dict)
    retiring: list[str] = dataclasses.field(default_factory=list)
    down: bool = False

    def role_slots(self, role: str) -> list[Slot]:
        """The role's slots, by index."""
        return sorted((s for s in self.slots.values() if s.role == role), key=lambda s: s.index)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ClusterState:
        raw = json.loads(text)
        slots = {name: Slot(**slot) for name, slot in raw.get("slots", {}).items()}
        return cls(raw.get("counts", {}), slots, list(raw.get("retiring", [])), bool(raw.get("down", False)))


class StateDir:
    """The state directory of one topology file."""

    def __init__(self, topology_file: Path) -> None:
        self.topology_file = topology_file.resolve()
        self.root = self.topology_file.with_suffix(".cluster")
        self.scripts = self.root / "scripts"
        self.secrets = self.root / "secrets"
        self.logs = self.root / "logs"
        self.run = self.root / "run"
        self.data = self.root / "data"

    def create(self) -> None:
        """Make the directories (``secrets`` private)."""
        for path in (self.root, self.scripts, self.logs, self.run, self.data):
            path.mkdir(parents=True, exist_ok=True)
        self.secrets.mkdir(mode=0o700, exist_ok=True)
        self.secrets.chmod(0o700)

    def read(self) -> ClusterState:
        """The current state (empty before the first ``up``)."""
        path = self.root / "state.json"
        return ClusterState.from_json(path.read_text()) if path.exists() else ClusterState()

    @contextlib.contextmanager
    def edit(self) -> Iterator[ClusterState]:
        """Read the state under an exclusive lock, let the caller change it, and write it back atomically."""
        self.create()
        with (self.root / "state.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                state = self.read()
                yield state
                tmp = self.root / "state.json.tmp"
                tmp.write_text(state.to_json())
                tmp.replace(self.root / "state.json")
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # Credentials -----------------------------------------------------------------------------------------
    def token_file(self, topology: Topology, role: str) -> Path:
        """The file holding ``role``'s token: the topology's, else one generated here."""
        given = topology.tokens.get(role)
        if given:
            path = Path(given)
            return path if path.is_absolute() else self.topology_file.parent / path
        return self.secrets / role

    def write_secrets(self, topology: Topology) -> None:
        """Generate the tokens the topology does not name, the internal token's digest (gateways only verify it)
        and the state DSN file; each 0600, never rewritten once there (jobs already running read them)."""
        self.create()
        for role in TOKEN_ROLES:
            if role not in topology.tokens:
                _write_private(self.secrets / role, secrets.token_urlsafe(32), keep=True)
        internal = self.token_file(topology, "internal").read_text().strip()
        _write_private(self.secrets / "internal.sha256", "sha256:" + hashlib.sha256(internal.encode()).hexdigest())
        _write_private(self.secrets / "state_dsn", topology.cluster.state_dsn)

    def gateway_key_file(self, topology: Topology) -> Path | None:
        """The signing key of per-gateway tokens (``cluster.gateway_token_key``), ``None`` when not configured."""
        given = topology.cluster.gateway_token_key
        if not given:
            return None
        path = Path(given)
        return path if path.is_absolute() else self.topology_file.parent / path

    def gateway_token_file(self, slot: str, job_id: str) -> Path:
        """The file holding the token of gateway job ``job_id`` of ``slot`` (its gateway id is ``<slot>-j<job>``)."""
        return self.secrets / f"{slot}.j{job_id}.gateway_token"

    def write_gateway_token(self, slot: str, job_id: str, token: str) -> None:
        """Write a gateway job's token (0600), before the job is released."""
        _write_private(self.gateway_token_file(slot, job_id), token)

    def token(self, topology: Topology, role: str) -> str:
        """``role``'s token (for this command's own calls: the admin token to list gateways)."""
        return self.token_file(topology, role).read_text().strip()

    # What jobs report ---------------------------------------------------------------------------------------
    def address_file(self, slot: str, job_id: str) -> Path:
        return self.run / f"{slot}.j{job_id}.address"

    def failed_file(self, slot: str, job_id: str) -> Path:
        return self.run / f"{slot}.j{job_id}.failed"

    def log_file(self, slot: str, job_id: str) -> Path:
        return self.logs / f"{slot}.j{job_id}.log"

    def reported(self, path: Path) -> str:
        """A report file's text, stripped ("" when absent)."""
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            return ""


def _write_private(path: Path, text: str, *, keep: bool = False) -> None:
    """Write ``text`` to ``path`` created 0600 (``keep``: leave an existing file as it is)."""
    if keep and path.exists():
        return
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text + "\n")
    tmp.replace(path)
