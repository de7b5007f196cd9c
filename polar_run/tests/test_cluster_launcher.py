"""``polar cluster supervise`` over a fake Slurm: ended jobs are replaced, failed ones are not, waves wait."""

from __future__ import annotations

import asyncio
from pathlib import Path

from polar_run.cluster.launcher import ClusterLauncher
from polar_run.cluster.slurm import JobView, Slurm
from polar_run.cluster.state import Slot
from polar_run.cluster.topology import PartitionInfo

TOPOLOGY = """
[cluster]
name = "t"
partition = "debug"
state_dsn = "sqlite:////tmp/never-opened.sqlite3"
[roles.rollout]
[roles.gateway]
count = 2
"""


class FakeSlurm(Slurm):
    """Jobs in memory; stops the supervisor after ``turns`` looks at the queue."""

    def __init__(self, stop: asyncio.Event, turns: int = 1) -> None:
        super().__init__()
        self.queue: dict[str, JobView] = {}
        self.submitted: list[str] = []
        self.cancelled: list[tuple[str, str]] = []
        self._stop = stop
        self._turns = turns
        self._next = 100

    def partition(self, name: str) -> PartitionInfo | None:
        return PartitionInfo(name=name, nodes=3, cpus_per_node=4, mem_mb_per_node=4000, max_time_s=None)

    def submit(self, script: Path, *, hold: bool = False) -> str:
        self._next += 1
        job = str(self._next)
        self.submitted.append(script.name)
        self.queue[job] = JobView(job, script.stem, "RUNNING", "node1", "None")
        return job

    def jobs(self) -> dict[str, JobView]:
        self._turns -= 1
        if self._turns <= 0:
            self._stop.set()
        return dict(self.queue)

    def cancel(self, job_ids: list[str], *, signal: str = "") -> None:  # type: ignore[override]
        self.cancelled += [(job, signal) for job in job_ids]


def launcher(tmp_path: Path, turns: int = 1) -> tuple[ClusterLauncher, FakeSlurm, asyncio.Event]:
    path = tmp_path / "t.toml"
    path.write_text(TOPOLOGY)
    stop = asyncio.Event()
    slurm = FakeSlurm(stop, turns)
    run = ClusterLauncher(path, slurm=slurm, say=lambda _: None)
    run.state.write_secrets(run.topology)
    with run.state.edit() as st:
        st.counts = {"rollout": 1, "gateway": 2}
        st.slots = {
            "rollout-1": Slot("rollout", 1, "1"),
            "gateway-1": Slot("gateway", 1, "2"),
            "gateway-2": Slot("gateway", 2, "3"),
        }
    for job in ("1", "2"):
        slurm.queue[job] = JobView(job, "x", "RUNNING", "node1", "None")
    return run, slurm, stop


async def test_an_ended_gateway_job_is_replaced(tmp_path: Path) -> None:
    run, slurm, stop = launcher(tmp_path)
    await run.supervise(0.01, stop=stop)
    assert slurm.submitted == ["gateway-2.sbatch"]
    slot = run.state.read().slots["gateway-2"]
    assert slot.past_jobs == ["3"]
    assert slot.job_id == "101"
    assert (run.state.scripts / "gateway-2.sbatch").read_text().startswith("#!/bin/bash")


async def test_a_job_that_failed_fast_is_not_resubmitted(tmp_path: Path) -> None:
    run, slurm, stop = launcher(tmp_path)
    run.state.failed_file("gateway-2", "3").write_text("cannot reach the rollout server at x:1\n")
    await run.supervise(0.01, stop=stop)
    assert slurm.submitted == []
    slot = run.state.read().slots["gateway-2"]
    assert slot.failed == "cannot reach the rollout server at x:1"
    rows = {row.slot: row for row in await run.status()}
    assert rows["gateway-2"].note == "failed: cannot reach the rollout server at x:1"
    assert not rows["gateway-2"].ready


async def test_gateways_wait_for_the_rollout_server(tmp_path: Path) -> None:
    run, slurm, stop = launcher(tmp_path, turns=1)
    del slurm.queue["1"]  # the rollout server's job ended: it is replaced first, gateways wait for it to run
    slurm.queue["2"] = JobView("2", "x", "RUNNING", "node1", "None")

    def submit_pending(script: Path, *, hold: bool = False) -> str:
        job = FakeSlurm.submit(slurm, script, hold=hold)
        slurm.queue[job] = JobView(job, script.stem, "PENDING", "", "Resources")
        return job

    slurm.submit = submit_pending  # type: ignore[method-assign]
    await run.supervise(0.01, stop=stop)
    assert slurm.submitted == ["rollout-1.sbatch"]


async def test_down_after_supervise_stops_it(tmp_path: Path) -> None:
    run, slurm, _ = launcher(tmp_path, turns=100)
    with run.state.edit() as st:
        st.down = True
    await asyncio.wait_for(run.supervise(0.01), 5)
    assert slurm.submitted == []
