"""``polar cluster`` on Slurm: bring a topology up, watch it, scale it, keep it at size, take it down.

* **up** validates the topology against the partition (``sinfo``) before any job is submitted, writes the
  credentials (0600) and the sbatch scripts, and submits in three waves, each waited for before the next: the
  rollout server; proxies, reconstructors and evaluators; gateways. Readiness comes from the services, never a
  sleep: a role is ready when its job reported its address and its gRPC health check answers SERVING; a gateway
  when the rollout server lists it (``ListGateways``) live and not draining. A job that ends or fails fast
  (``run/<slot>.j<job>.failed``) stops the wait with its reason.
* **supervise** keeps the fleet at size: every ``interval_s`` it replaces each slot whose job ended (a time limit,
  ``scancel``, a node lost) with a new job of the same script, wave by wave (gateways only while the rollout
  server's job runs). A slot whose job failed fast is not resubmitted (``status`` shows why) until ``up`` or
  ``scale`` asks again. It exits after ``down``.
* **scale ROLE N** changes a role's count: new slots are submitted and waited for; slots above ``N`` retire (a
  gateway with SIGUSR1, so it drains and hands back what still runs; other roles are cancelled).
* **Per-gateway tokens** (``cluster.gateway_token_key``): each gateway job is submitted held, its token (for its
  gateway id ``<slot>-j<job>``) written to the state directory, and the job released.
* **down** cancels gateways first (SIGTERM: each hands its sessions back while the rollout server still runs),
  then every other job, and waits until Slurm lists none of them.

Sessions are never lost with a gateway: one that is signalled hands them back as an outage (no attempt used), and
one that vanishes (SIGKILL, a node down) loses its lease, so the rollout server retries its sessions elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from polar.rollout.v1 import rollout_service_pb2, rollout_service_pb2_grpc

from polar_core.channels import open_channel
from polar_core.errors import FailedPrecondition, InvalidArgument
from polar_core.gateway_tokens import issue_gateway_token, load_signing_key
from polar_run.cluster.scripts import render_script
from polar_run.cluster.slurm import JobView, Slurm
from polar_run.cluster.state import ClusterState, Slot, StateDir
from polar_run.cluster.topology import ROLES, Topology, check_against_partition, load_topology, role_counts

__all__ = ["WAVES", "ClusterLauncher", "SlotStatus"]

_log = logging.getLogger(__name__)

WAVES: tuple[tuple[str, ...], ...] = (("rollout",), ("proxy", "reconstructor", "evaluator"), ("gateway",))
_POLL_S = 0.5


@dataclasses.dataclass(frozen=True, slots=True)
class SlotStatus:
    """One slot as ``status`` shows it."""

    slot: str
    job_id: str
    state: str
    node: str
    ready: bool
    note: str


class ClusterLauncher:
    """The ``polar cluster`` commands over one topology file.

    Args:
        topology_file: The topology (its state directory is next to it).
        slurm: The Slurm client commands.
        say: Where progress lines go.
    """

    def __init__(self, topology_file: Path, *, slurm: Slurm | None = None, say: Callable[[str], None] = print) -> None:
        self.topology: Topology = load_topology(topology_file)
        self.state = StateDir(topology_file)
        self.slurm = slurm or Slurm()
        self._say = say

    # Commands --------------------------------------------------------------------------------------------------
    async def up(self) -> None:
        """Validate, submit what is missing, wave by wave, and wait until every slot is ready."""
        counts = role_counts(self.topology)
        self._check(counts)
        self.state.write_secrets(self.topology)
        with self.state.edit() as st:
            st.down = False
            st.counts = counts
            for slot in st.slots.values():
                slot.failed = ""
        deadline = time.monotonic() + self.topology.cluster.ready_timeout_s
        for wave in WAVES:
            with self.state.edit() as st:
                submitted = self._reconcile(st, self.slurm.jobs(), wave, retry_failed=True)
            for name, job in submitted:
                self._say(f"submitted {name} as job {job}")
            await self._wait_ready(wave, deadline)
        self._say("all roles are ready")

    async def scale(self, role: str, count: int) -> None:
        """Set ``role``'s count; submit new slots and wait for them, retire the ones above ``count``."""
        if role not in ROLES:
            raise InvalidArgument(f"unknown role {role!r}; choose from {', '.join(ROLES)}")
        if count < 0 or (role == "rollout" and count != 1):
            raise InvalidArgument(f"count: {count} is not a valid count of {role}")
        with self.state.edit() as st:
            if st.down or not st.counts:
                raise FailedPrecondition("the cluster is not up: run `polar cluster up` first")
            self._check({**st.counts, role: count})
            st.counts[role] = count
            submitted = self._reconcile(st, self.slurm.jobs(), (role,), retry_failed=True)
        for slot, job in submitted:
            self._say(f"submitted {slot} as job {job}")
        await self._wait_ready((role,), time.monotonic() + self.topology.cluster.ready_timeout_s)
        self._say(f"{role}: {count} ready")

    async def supervise(self, interval_s: float = 5.0, *, stop: asyncio.Event | None = None) -> None:
        """Replace ended jobs until ``down`` (or ``stop``)."""
        stop = stop or asyncio.Event()
        while not stop.is_set():
            with self.state.edit() as st:
                if st.down:
                    return
                jobs = self.slurm.jobs()
                submitted: list[tuple[str, str]] = []
                for index, wave in enumerate(WAVES):
                    if index and not self._running(st, jobs, WAVES[0]):
                        break  # gateways and proxies need the rollout server: wait for its replacement first
                    submitted += self._reconcile(st, jobs, wave, retry_failed=False)
            for slot, job in submitted:
                self._say(f"replaced {slot}: job {job}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)

    async def down(self, timeout_s: float = 180.0) -> None:
        """Cancel every job (gateways first, so they hand back while the rollout server runs); wait until gone."""
        with self.state.edit() as st:
            st.down = True
            gateways = [s.job_id for s in st.role_slots("gateway") if s.job_id]
            others = [s.job_id for s in st.slots.values() if s.job_id and s.role != "gateway"]
            retiring = list(st.retiring)
        deadline = time.monotonic() + timeout_s
        alive = self.slurm.jobs()  # scancel refuses a job that already ended
        first = [j for j in dict.fromkeys(gateways + retiring) if j in alive and j not in others]
        self.slurm.cancel(first)
        await self._wait_gone(first, deadline)
        alive = self.slurm.jobs()
        self.slurm.cancel([j for j in others if j in alive])
        await self._wait_gone(others, deadline)
        with self.state.edit() as st:
            st.slots = {}
            st.retiring = []
            st.counts = {}
        for address in self.state.run.glob("*.address"):
            address.unlink()
        self._say(f"down: {len(gateways) + len(others)} jobs ended")

    async def status(self) -> list[SlotStatus]:
        """Every slot: its job, Slurm's state and node, and whether it is ready (or why it failed)."""
        st = self.state.read()
        jobs = self.slurm.jobs() if st.slots else {}
        pool = await self._gateway_pool() if st.slots else {}
        found = []
        for role in ROLES:
            for slot in st.role_slots(role):
                job = jobs.get(slot.job_id)
                ready, note = await self._readiness(slot, job, pool)
                found.append(
                    SlotStatus(
                        slot.name,
                        slot.job_id or "-",
                        job.state if job is not None else "ENDED",
                        job.nodes if job is not None and job.nodes else "-",
                        ready,
                        note,
                    )
                )
        return found

    def log_files(self, role: str, index: int | None = None) -> list[Path]:
        """The log of each of ``role``'s slots' current (else latest) job."""
        if role not in ROLES:
            raise InvalidArgument(f"unknown role {role!r}; choose from {', '.join(ROLES)}")
        st = self.state.read()
        files = []
        for slot in st.role_slots(role):
            if index is not None and slot.index != index:
                continue
            for job in [slot.job_id, *reversed(slot.past_jobs)]:
                if job and self.state.log_file(slot.name, job).exists():
                    files.append(self.state.log_file(slot.name, job))
                    break
        return files

    # Reconciling -----------------------------------------------------------------------------------------------
    def _check(self, counts: dict[str, int]) -> None:
        check_against_partition(self.topology, self.slurm.partition(self.topology.cluster.partition), counts)

    def _reconcile(
        self, st: ClusterState, jobs: dict[str, JobView], roles: Iterable[str], *, retry_failed: bool
    ) -> list[tuple[str, str]]:
        """Retire slots above each role's count, submit a job for every slot without a live one; return what was
        submitted as ``(slot, job id)``."""
        submitted = []
        st.retiring = [j for j in st.retiring if j in jobs]
        key_file = self.state.gateway_key_file(self.topology)
        key = load_signing_key(key_file) if key_file is not None and "gateway" in roles else None
        for role in roles:
            want = st.counts.get(role, 0)
            for slot in st.role_slots(role):
                if slot.index > want:
                    self._retire(st, slot, jobs)
            for index in range(1, want + 1):
                slot = st.slots.setdefault(f"{role}-{index}", Slot(role, index))
                job = jobs.get(slot.job_id)
                if job is not None and job.alive:
                    continue
                if slot.job_id:
                    failed = self.state.reported(self.state.failed_file(slot.name, slot.job_id))
                    slot.past_jobs.append(slot.job_id)
                    slot.job_id = ""
                    if failed:
                        slot.failed = failed
                if slot.failed and not retry_failed:
                    continue
                script = self.state.scripts / f"{slot.name}.sbatch"
                script.write_text(render_script(self.topology, self.state, role, index))
                if role == "gateway" and key is not None:
                    slot.job_id = self._submit_with_token(script, slot.name, key)
                else:
                    slot.job_id = self.slurm.submit(script)
                slot.failed = ""
                submitted.append((slot.name, slot.job_id))
        return submitted

    def _submit_with_token(self, script: Path, slot: str, key: bytes) -> str:
        """Submit a gateway's job held, write the token of its gateway id (``<slot>-j<job>``), then release it: the
        id holds the job id, which only exists once submitted, and the job must not start before its token."""
        job = self.slurm.submit(script, hold=True)
        try:
            token = issue_gateway_token(key, f"{slot}-j{job}", ttl_s=self.topology.gateway_token_ttl_s())
            self.state.write_gateway_token(slot, job, token)
            self.slurm.release([job])
        except BaseException:
            self.slurm.cancel([job])
            raise
        return job

    def _retire(self, st: ClusterState, slot: Slot, jobs: dict[str, JobView]) -> None:
        if slot.job_id in jobs:
            # A gateway drains (SIGUSR1 to `polar serve`) and hands back what still runs; the others just stop.
            self.slurm.cancel([slot.job_id], signal="USR1" if slot.role == "gateway" else "")
            st.retiring.append(slot.job_id)
        self._say(f"retiring {slot.name}" + (f" (job {slot.job_id})" if slot.job_id else ""))
        del st.slots[slot.name]

    @staticmethod
    def _running(st: ClusterState, jobs: dict[str, JobView], roles: Sequence[str]) -> bool:
        return all(
            (job := jobs.get(slot.job_id)) is not None and job.state == "RUNNING"
            for role in roles
            for slot in st.role_slots(role)
        )

    async def _wait_gone(self, job_ids: Sequence[str], deadline: float) -> None:
        while True:
            left = set(job_ids) & set(self.slurm.jobs())
            if not left:
                return
            if time.monotonic() > deadline:
                raise FailedPrecondition(f"jobs {', '.join(sorted(left))} did not end")
            await asyncio.sleep(_POLL_S)

    # Readiness -------------------------------------------------------------------------------------------------
    async def _wait_ready(self, roles: Sequence[str], deadline: float) -> None:
        while True:
            st = self.state.read()
            jobs = self.slurm.jobs()
            pool = await self._gateway_pool() if "gateway" in roles else {}
            waiting = []
            for role in roles:
                for slot in st.role_slots(role):
                    job = jobs.get(slot.job_id)
                    failed = self.state.reported(self.state.failed_file(slot.name, slot.job_id))
                    if failed:
                        raise FailedPrecondition(f"{slot.name} (job {slot.job_id}) failed: {failed}")
                    if job is None or not job.alive:
                        tail = self._log_tail(slot)
                        raise FailedPrecondition(f"{slot.name}: job {slot.job_id} ended before it was ready\n{tail}")
                    ready, note = await self._readiness(slot, job, pool)
                    if not ready:
                        waiting.append(f"{slot.name} ({note})")
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise FailedPrecondition(f"not ready in time: {', '.join(waiting)}")
            await asyncio.sleep(_POLL_S)

    async def _readiness(
        self, slot: Slot, job: JobView | None, pool: dict[str, rollout_service_pb2.GatewayInfo]
    ) -> tuple[bool, str]:
        """Whether the slot's current job serves, and a note saying how (or why not)."""
        if not slot.job_id:
            return False, f"failed: {slot.failed}" if slot.failed else "no job"
        failed = self.state.reported(self.state.failed_file(slot.name, slot.job_id))
        if failed or slot.failed:
            return False, f"failed: {failed or slot.failed}"
        if job is None:
            return False, "job ended"
        if job.state != "RUNNING":
            return False, f"{job.state.lower()} ({job.reason})" if job.reason and job.reason != "None" else job.state
        if slot.role == "gateway":
            info = pool.get(f"{slot.name}-j{slot.job_id}")
            if info is None:
                return False, "not registered yet"
            if not info.live:
                return False, f"registered as {info.gateway_id}, lease expired"
            what = "draining" if info.draining else "live"
            note = f"{info.gateway_id} {what} at {info.address}, {info.active_sessions}/{info.capacity} sessions"
            return not info.draining, note
        address = self.state.reported(self.state.address_file(slot.name, slot.job_id))
        if not address:
            return False, "starting"
        if await _serving(address):
            return True, f"serving at {address}"
        return False, f"starting at {address}"

    async def _gateway_pool(self) -> dict[str, rollout_service_pb2.GatewayInfo]:
        """The rollout server's gateway list by id (empty while it does not answer)."""
        address = self.state.reported(self.state.run / "rollout-1.address")
        if not address:
            return {}
        channel = open_channel(address, auth_token=self.state.token(self.topology, "admin"))
        try:
            stub = rollout_service_pb2_grpc.RolloutServiceStub(channel)
            reply = await stub.ListGateways(rollout_service_pb2.ListGatewaysRequest(), timeout=5)
        except grpc.aio.AioRpcError as exc:
            _log.info("the rollout server at %s did not list its gateways: %s", address, exc.details())
            return {}
        finally:
            await channel.close(None)
        return {g.gateway_id: g for g in reply.gateways}

    def _log_tail(self, slot: Slot, lines: int = 15) -> str:
        path = self.state.log_file(slot.name, slot.job_id)
        try:
            text = path.read_text(errors="replace")
        except FileNotFoundError:
            return f"(no log at {path})"
        return f"--- last lines of {path} ---\n" + "\n".join(text.splitlines()[-lines:])


async def _serving(address: str) -> bool:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=3)
        except grpc.aio.AioRpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
