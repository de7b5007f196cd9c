"""The Slurm commands ``polar cluster`` runs: ``sinfo``, ``sbatch``, ``squeue``, ``scancel``, ``scontrol release``
(found on ``PATH``; ``SLURM_CONF`` and the rest of the environment pass through).

Nothing secret is ever an argument here: jobs get their credentials from files the generated script reads.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from polar_core.errors import FailedPrecondition
from polar_run.cluster.topology import PartitionInfo, parse_time_limit

__all__ = ["ALIVE_STATES", "JobView", "Slurm"]

# squeue states of a job that holds or will hold its slot; COMPLETING means it is ending (a replacement is due).
ALIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "REQUEUED", "RESIZING", "SIGNALING"})


@dataclasses.dataclass(frozen=True, slots=True)
class JobView:
    """One job as ``squeue`` shows it."""

    job_id: str
    name: str
    state: str
    nodes: str
    reason: str

    @property
    def alive(self) -> bool:
        """Whether it is pending or running (not ending)."""
        return self.state in ALIVE_STATES


class Slurm:
    """Runs the Slurm client commands; every failure is a :class:`FailedPrecondition` with Slurm's words."""

    def __init__(self, timeout_s: float = 60.0) -> None:
        self._timeout_s = timeout_s

    def _run(self, argv: Sequence[str], *, tolerate: Sequence[str] = ()) -> str:
        if shutil.which(argv[0]) is None:
            raise FailedPrecondition(f"{argv[0]} is not installed: polar cluster needs the Slurm client commands")
        try:
            done = subprocess.run(list(argv), capture_output=True, text=True, timeout=self._timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise FailedPrecondition(f"{argv[0]} did not answer in {self._timeout_s:.0f} s") from None
        if done.returncode != 0:
            words = done.stderr + done.stdout
            if tolerate and all(any(t in line for t in tolerate) for line in words.splitlines() if line.strip()):
                return done.stdout
            raise FailedPrecondition(f"{' '.join(argv[:2])} failed: {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    def partition(self, name: str) -> PartitionInfo | None:
        """What partition ``name`` offers (``None`` when Slurm does not know it): nodes, and the smallest node's
        CPUs and memory."""
        out = self._run(["sinfo", "-h", "-N", "-p", name, "-o", "%N|%c|%m|%l|%R"])
        rows = [line.split("|") for line in out.splitlines() if line.strip()]
        rows = [row for row in rows if len(row) == 5 and row[4] == name]
        if not rows:
            return None
        nodes = {row[0]: row for row in rows}
        limit = rows[0][3].strip()
        return PartitionInfo(
            name=name,
            nodes=len(nodes),
            cpus_per_node=min(int(row[1].rstrip("+")) for row in nodes.values()),
            mem_mb_per_node=min(int(row[2].rstrip("+")) for row in nodes.values()),
            max_time_s=None if limit in ("infinite", "n/a", "") else parse_time_limit(limit),
        )

    def submit(self, script: Path, *, hold: bool = False) -> str:
        """``sbatch`` a script (``hold``: held until :meth:`release`); return the job id."""
        out = self._run(["sbatch", "--parsable", *(["--hold"] if hold else []), str(script)])
        return out.strip().split(";")[0]

    def release(self, job_ids: Sequence[str]) -> None:
        """``scontrol release`` held jobs."""
        if job_ids:
            self._run(["scontrol", "release", ",".join(job_ids)])

    def jobs(self) -> dict[str, JobView]:
        """This user's jobs that have not ended, by job id."""
        out = self._run(["squeue", "-h", "--me", "-o", "%i|%j|%T|%N|%r"])
        found = {}
        for line in out.splitlines():
            parts = line.split("|")
            if len(parts) == 5:
                found[parts[0]] = JobView(*parts)
        return found

    def cancel(self, job_ids: Sequence[str], *, signal: str = "") -> None:
        """``scancel`` jobs (with ``signal``: only signal their batch shell, e.g. ``USR1`` to drain a gateway)."""
        if not job_ids:
            return
        argv = ["scancel"]
        if signal:
            argv += ["--batch", f"--signal={signal}"]
        # A job that ended meanwhile is no error: it is gone, as asked.
        self._run([*argv, *job_ids], tolerate=("already completing or completed", "Invalid job id"))
