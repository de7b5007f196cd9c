"""A private, throwaway Slurm on this machine: munged, slurmctld and several slurmd node names, all in one directory.

Debian's ``slurm-wlm`` (22.05) and ``munge`` (``scripts/setup_slurm.sh`` installs them) run as root with their
key, sockets, state, spool, logs and pid files under a temporary directory and on ports picked free, so a test
run touches nothing of a system Slurm and two runs do not collide. Several node names share this host
(``NodeHostname`` is this machine, each ``slurmd -N nodeK`` listens on its own port; ``SlurmdParameters=
config_overrides`` lets them declare more CPUs than the host has). Clients find the cluster through
``SLURM_CONF`` (:attr:`PrivateSlurm.env`). Teardown cancels every job, stops the daemons and removes the directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from integration_tests.support.ports import free_ports

__all__ = ["PrivateSlurm", "private_slurm", "slurm_missing"]

_DAEMONS = ("munged", "slurmctld", "slurmd")
_CLIENTS = ("sbatch", "squeue", "scancel", "sinfo", "scontrol")


def slurm_missing() -> str | None:
    """Why a private Slurm cannot run here (``None`` when it can)."""
    if os.geteuid() != 0:
        return "a private Slurm needs root (slurmd runs jobs as their user)"
    missing = [name for name in (*_DAEMONS, *_CLIENTS) if _program(name) is None]
    if missing:
        return f"Slurm is not installed (missing {', '.join(missing)}); run scripts/setup_slurm.sh as root"
    return None


def _program(name: str) -> str | None:
    """The path of a Slurm or munge program (daemons live in /usr/sbin, which a user's PATH may lack)."""
    return shutil.which(name) or (f"/usr/sbin/{name}" if Path(f"/usr/sbin/{name}").exists() else None)


@dataclasses.dataclass
class PrivateSlurm:
    """A running private Slurm.

    Attributes:
        root: Its directory (configuration, state, logs).
        conf: Its ``slurm.conf``.
        partition: The one partition (default).
        nodes: Its node names.
        cpus: CPUs each node declares.
        memory_mb: Memory each node declares.
    """

    root: Path
    conf: Path
    partition: str
    nodes: tuple[str, ...]
    cpus: int
    memory_mb: int
    _procs: list[subprocess.Popen[bytes]] = dataclasses.field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """The environment a Slurm client needs to talk to this cluster (``SLURM_CONF``)."""
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster."""
        return subprocess.run(
            argv, env={**os.environ, **self.env}, capture_output=True, text=True, timeout=timeout, check=check
        )

    def job_ids(self) -> list[str]:
        """Ids of every job the controller knows that has not ended."""
        out = self.run("squeue", "-h", "-o", "%i", check=False).stdout
        return out.split()

    def logs(self) -> str:
        """The tails of the daemons' logs, for assertion messages."""
        parts = []
        for log in sorted(self.root.glob("*.log")):
            parts.append(f"===== {log.name} =====\n{log.read_text(errors='replace')[-2000:]}")
        return "\n".join(parts)


def _conf(
    root: Path, *, name: str, nodes: int, cpus: int, memory_mb: int, ctld_port: int, node_ports: list[int]
) -> str:
    host = socket.gethostname().split(".")[0]
    return "\n".join(
        [
            f"ClusterName={name}",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={root}/munge.sock",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={root}/ctld",
            f"SlurmdSpoolDir={root}/spool/%n",
            f"SlurmctldPidFile={root}/slurmctld.pid",
            f"SlurmdPidFile={root}/slurmd.%n.pid",
            f"SlurmctldLogFile={root}/slurmctld.log",
            f"SlurmdLogFile={root}/slurmd.%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU_Memory",
            "SlurmdParameters=config_overrides",
            "SchedulerType=sched/backfill",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "ReturnToService=2",
            "SlurmdTimeout=30",
            # A signalled job (scancel, time limit) gets this long between SIGTERM and SIGKILL: a gateway hands
            # its sessions back in it.
            "KillWait=15",
            "MinJobAge=30",
            "InactiveLimit=0",
            f"NodeName=node[1-{nodes}] NodeHostname={host} NodeAddr=127.0.0.1 "
            f"Port=[{node_ports[0]}-{node_ports[-1]}] CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN",
            f"PartitionName=debug Nodes=node[1-{nodes}] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4",
            "",
        ]
    )


def _wait(check: Callable[[], bool], what: str, slurm: PrivateSlurm, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"private Slurm: {what} did not happen\n{slurm.logs()}")
        time.sleep(0.2)


@contextlib.contextmanager
def private_slurm(*, nodes: int = 3, cpus: int = 4, memory_mb: int = 4000) -> Iterator[PrivateSlurm]:
    """Start munged, slurmctld and ``nodes`` slurmd node names on this host; yield the cluster; tear it all down."""
    root = Path(tempfile.mkdtemp(prefix="polar-slurm-"))
    root.chmod(0o755)
    for sub in ("ctld", "spool"):
        (root / sub).mkdir()
    key = root / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    ctld_port, *node_ports = free_ports(nodes + 1, host="", consecutive=True)
    conf = root / "slurm.conf"
    name = f"polar{secrets.token_hex(3)}"
    conf.write_text(
        _conf(root, name=name, nodes=nodes, cpus=cpus, memory_mb=memory_mb, ctld_port=ctld_port, node_ports=node_ports)
    )
    (root / "cgroup.conf").write_text("CgroupPlugin=autodetect\n")
    names = tuple(f"node{i}" for i in range(1, nodes + 1))
    slurm = PrivateSlurm(root, conf, "debug", names, cpus, memory_mb)
    env = {**os.environ, **slurm.env}
    try:
        subprocess.run(
            [
                _program("munged") or "munged",
                "--force",
                f"--key-file={key}",
                f"--socket={root}/munge.sock",
                f"--pid-file={root}/munged.pid",
                f"--log-file={root}/munged.log",
                f"--seed-file={root}/munged.seed",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )
        with (root / "daemons.out").open("wb") as out:
            slurm._procs.append(
                subprocess.Popen(
                    [_program("slurmctld") or "slurmctld", "-D", "-i", "-f", str(conf)], env=env, stdout=out, stderr=out
                )
            )
            for node in names:
                slurm._procs.append(
                    subprocess.Popen(
                        [_program("slurmd") or "slurmd", "-D", "-N", node, "-f", str(conf)],
                        env=env,
                        stdout=out,
                        stderr=out,
                    )
                )

        def idle() -> bool:
            result = slurm.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
            states = dict(line.split() for line in result.stdout.splitlines() if line.strip())
            return all(states.get(node, "").startswith("idle") for node in names)

        _wait(idle, "every node idle", slurm)
        yield slurm
    finally:
        _teardown(slurm)


def _teardown(slurm: PrivateSlurm) -> None:
    root = slurm.root
    if slurm._procs:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            slurm.run("scancel", "--full", "-u", "root", check=False, timeout=30)
            deadline = time.monotonic() + 40
            while slurm.job_ids() and time.monotonic() < deadline:
                time.sleep(0.3)
    for proc in reversed(slurm._procs):
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
    for proc in reversed(slurm._procs):
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    pid_file = root / "munged.pid"
    if pid_file.exists():
        with contextlib.suppress(ValueError, ProcessLookupError):
            pid = int(pid_file.read_text().strip())
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                os.kill(pid, 0)
                time.sleep(0.1)
    shutil.rmtree(root, ignore_errors=True)
