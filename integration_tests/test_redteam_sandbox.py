"""Red team: a hostile agent inside the local runtime (as root and as an unprivileged host user) and Docker.

Each attack in :mod:`integration_tests.support.sandbox_attacks` must fail, bounded by the sandbox's limits,
with the host file, the process outside, the other session's command and files, the stand-in for the proxy's
records and the host listeners untouched: capabilities, remount, signals and ptrace, other sessions, the host
process's credentials in the environment and ``/proc``, loopback/LAN/Internet connections, nested user
namespaces, fork and memory bombs, giant and sparse files, ``/tmp``/``/dev/shm`` fills, a disk fill past the
workspace quota (``DiskQuotaExceeded``), symlinks planted for the runtime's upload and download. Patch
collection refuses a giant file or patch with a clear reason (``PatchTooLarge``, which the pipeline turns into
``invalid_patch``). The end-to-end version on a real gateway is ``test_redteam_gateway.py``; the evaluator-side
attacks (pytest configuration and ``conftest.py`` tricks, killing pytest at import) are in
``test_redteam_evaluator.py``; control-plane credentials by role in ``test_roles.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.agent import HarnessAgentRunner
from gateway.core import SessionPipeline
from gateway.errors import PatchTooLarge
from gateway.models import (
    AgentRun,
    Artifacts,
    EvaluatorConfig,
    HarnessConfig,
    PipelineConfig,
    ProxyEndpoints,
    SessionSpec,
)
from gateway.testing import (
    FakeAgentRunner,
    FakeEvaluator,
    FakeProxy,
    FakeReconstructor,
    FakeRuntimeFactory,
    RecordingSink,
)
from integration_tests.support.docker import private_docker
from integration_tests.support.egress import accepted, received
from integration_tests.support.sandbox_attacks import (
    ATTACKS,
    CANARY_NAME,
    LIMITS,
    NETWORK_PROBE,
    QUOTA_FILL,
    QUOTA_FILL_BYTES,
    QUOTA_LIMIT,
    egress_targets,
    run_attacks,
)
from integration_tests.support.unprivileged import run_module_as, unprivileged_dir
from polar_core.errors import NotFound
from polar_core.records import TerminalStatus
from runtimes import ExecResult, Isolation, Runtime, RuntimeKind, RuntimeSpec
from runtimes._limits import parse_size
from runtimes.docker import DockerRuntime
from runtimes.errors import DiskQuotaExceeded
from runtimes.local import LocalRuntime, probe_isolation

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


# Counts the container's processes with shell builtins alone (no fork): only the shell itself is added.
_COUNT_PROCESSES = "n=0; for p in /proc/[0-9]*; do n=$((n+1)); done; echo $n"


async def _process_count(runtime: Runtime) -> int | None:
    """How many processes the container runs (the counting shell included); None when it could not start."""
    result = await runtime.exec(["sh", "-c", _COUNT_PROCESSES], timeout=30)
    return int(result.stdout.split()[-1]) if result.ok and result.stdout.strip() else None


async def _until_processes_at_most(runtime: Runtime, most: int | None, *, deadline_s: float = 90.0) -> None:
    """Wait until the container runs no more processes than ``most`` (a fork bomb burnt out)."""
    assert most is not None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    seen: int | None = None
    while loop.time() < deadline:
        seen = await _process_count(runtime)
        if seen is not None and seen <= most:
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"the fork bomb's processes were still there after {deadline_s:.0f} s ({seen} > {most})")


def _check_outcomes(out: dict[str, Any], *, pids_limit: int, root_without_capabilities: bool = False) -> None:
    """``root_without_capabilities``: the sandbox's user may be id 0 (gVisor as an ordinary user, whose user
    namespace maps that one id), with an empty bounding set so that nothing can give it a capability back."""
    caps = out["capabilities"]["stdout"]
    assert "CapEff:\t0000000000000000" in caps
    assert "CapPrm:\t0000000000000000" in caps
    assert "CapBnd:\t0000000000000000" in caps
    if not root_without_capabilities:
        assert caps.split()[-1] != "0", "the command runs as root inside"
    assert out["remount"]["exit_code"] != 0
    assert out["write_read_only"]["exit_code"] != 0
    assert out["host_file"] == "original\n"
    # Signals and ptrace: nothing outside the sandbox (host process, the other session's command) is reachable.
    assert out["kill_outsider"]["exit_code"] != 0
    assert out["ptrace_outsider"]["exit_code"] != 0
    assert out["outsider_alive"]
    assert out["victim_alive"]
    # Other sessions and the proxy's/gateway's files are not even visible.
    assert out["read_other_session"]["exit_code"] != 0
    assert out["write_other_session"]["exit_code"] != 0
    assert out["victim_after_quota"]["stdout"] == "victim secret\n"
    # The host's sessions directory does not exist inside: the sandbox sees its own session only, at
    # container_root, never the host path that names the others.
    assert out["list_sessions"]["exit_code"] != 0
    assert out["list_sessions"]["stdout"] == ""
    assert out["read_records"]["exit_code"] != 0
    assert "secret" not in out["read_records"]["stdout"]
    assert out["secrets"] == ["records.jsonl", "session.json"]
    assert out["secrets_unchanged"]
    # No credential of the host process in the sandbox's environment or anywhere in its /proc.
    assert out["canary"] not in out["credentials"]["stdout"]
    assert out["credentials"]["stdout"].rstrip().endswith("scanned")
    # Network: loopback services of the host and listeners on its own interface address (TCP on every address,
    # TCP and UDP on that address only: the way out of this host) are all refused, and none received anything.
    lines = out["network"]["stdout"].splitlines()
    assert len(lines) == len(out["targets"]), out["network"]
    assert all(line.startswith("refused") for line in lines), lines
    assert out["accepted"] == 0
    if out["isolation"] != "gvisor":
        assert out["new_user_namespace"]["exit_code"] != 0
    # Under gVisor a nested user namespace is gVisor's own kernel's: none reaches the host kernel.
    forked = int(out["fork_count"]["stdout"].split("forked")[1].split()[0])
    assert "refused" in out["fork_count"]["stdout"]
    assert forked < pids_limit
    assert not out["fork_bomb"]["timed_out"]
    assert out["memory_bomb"]["exit_code"] != 0
    assert out["memory_grow"]["exit_code"] != 0
    assert not out["memory_grow"]["timed_out"]
    size_limit = 64 * 1024 * 1024
    assert "rc=0" not in out["sparse_file"]["stdout"]
    assert int(out["sparse_file"]["stdout"].split()[-1]) <= size_limit
    assert int(out["disk_fill"]["stdout"].split()[-1]) <= size_limit
    # /tmp and /dev/shm are tmpfs of tmp_size; /dev itself is read-only.
    tmp_size = parse_size(LIMITS["tmp_size"])
    assert int(out["tmp_fill"]["stdout"].split()[-1]) <= tmp_size
    assert int(out["shm_fill"]["stdout"].split()[-1]) <= tmp_size
    assert out["dev_write"]["exit_code"] != 0
    etc = out["etc"]["stdout"]
    assert "present" not in etc, etc
    assert etc.split()[:2] == ["polar-sandbox", "polar-sandbox"]
    # Links the agent planted: downloads refuse them, uploads replace them or refuse; the host is untouched.
    assert "root:" not in out["plant_symlinks"]["stdout"]
    links = out["symlinks"]
    assert links["download_shadow"] == links["download_records"] == "PathEscapesSession"
    assert links["download_through_dir"] == "PathEscapesSession"
    assert links["upload_through_dir_link"] == "PathEscapesSession"
    assert links["upload_over_file_link"] in ("ok", "PathEscapesSession")
    assert links["upload_tree_over_dir_link"] in ("ok", "PathEscapesSession")
    assert out["host_target"] == "original\n"
    quota = out["quota"]
    assert quota["removed"]
    assert quota["images_left"] == []
    if out["host_uid"] == 0 and out["isolation"] != "gvisor":
        # Root: the session directory is a file system of the quota's size. The write past it fails (ENOSPC):
        # nothing is written beyond the quota, neither in the session nor on the host's disk. A sandbox that filled
        # it has reached its quota: DiskQuotaExceeded for this and every later command, as with the watchdog.
        assert quota["raised"] == "DiskQuotaExceeded", quota
        assert "filled its disk quota" in quota["message"], quota
        assert quota["host_bytes"] <= parse_size(QUOTA_LIMIT)
        assert quota["image_bytes"] is not None
        assert quota["image_bytes"] <= parse_size(QUOTA_LIMIT)
        assert quota["later"] == "DiskQuotaExceeded"
    else:
        # No loop mount without root (nor for gVisor's sessions): the watchdog kills the command with
        # DiskQuotaExceeded, and every later one; what it left on the host is bounded (the quota plus what a writer
        # manages between two samples).
        assert quota["raised"] == "DiskQuotaExceeded", quota
        assert "disk quota" in quota["message"]
        assert quota["later"] == "DiskQuotaExceeded"
        assert parse_size(QUOTA_LIMIT) < quota["host_bytes"] < QUOTA_FILL_BYTES // 2
    assert out["after"]["stdout"].strip() == "alive"


# ``bwrap``: the local runtime's ``auto`` (bubblewrap here); ``gvisor``: the gVisor runtime, skipped with the probe's
# reason where runsc cannot run.
_ISOLATIONS = [Isolation.AUTO, Isolation.GVISOR]


async def _require(isolation: Isolation) -> None:
    if isolation is Isolation.GVISOR:
        shortfall = (await probe_isolation(Isolation.GVISOR)).shortfall(Isolation.GVISOR)
        if shortfall is not None:
            pytest.skip(shortfall)


@pytest.mark.timeout(400)  # under gVisor's ptrace platform every command costs ~0.5 s more
@pytest.mark.parametrize("isolation", _ISOLATIONS, ids=["bwrap", "gvisor"])
async def test_attacks_fail_as_root(tmp_path: Path, isolation: Isolation) -> None:
    if os.geteuid() != 0:
        pytest.skip("the runtime as root needs a root test process")
    await _require(isolation)
    out = await run_attacks(tmp_path, isolation)
    _check_outcomes(out, pids_limit=int(LIMITS["pids_limit"]))
    assert out["capabilities"]["stdout"].split()[-1] == "65534"


@pytest.fixture
def user_dir() -> Iterator[tuple[str, Path]]:
    with unprivileged_dir() as found:
        yield found


@pytest.mark.timeout(400)
@pytest.mark.parametrize("isolation", _ISOLATIONS, ids=["bwrap", "gvisor"])
async def test_attacks_fail_as_an_unprivileged_user(user_dir: tuple[str, Path], isolation: Isolation) -> None:
    user, directory = user_dir
    if not user:
        await _require(isolation)
        out = await run_attacks(directory, isolation)
    else:
        returncode, stdout, stderr = await run_module_as(
            user, "integration_tests.support.sandbox_attacks", str(directory), isolation.value
        )
        if returncode != 0 and b"IsolationUnavailable: " in stderr:  # the probe as that user: its reason
            pytest.skip(stderr.decode().split("IsolationUnavailable: ")[-1].strip()[:300])
        assert returncode == 0, stderr.decode()[-2000:]
        out = json.loads(stdout)
        assert out["host_uid"] != 0
        assert b"not enforced on this host" in stderr  # the runtime says what it cannot enforce
    rootless_gvisor = isolation is Isolation.GVISOR and (bool(user) or os.geteuid() != 0)
    _check_outcomes(out, pids_limit=int(LIMITS["pids_limit"]), root_without_capabilities=rootless_gvisor)


def _spec(argv: list[str]) -> SessionSpec:
    return SessionSpec(session_id="big", task_id="t", harness=HarnessConfig("command", {"argv": argv}))


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        ("truncate -s 2G huge.bin; truncate -s 32M big.bin", "the file big.bin is larger than the patch limit"),
        ("for i in 1 2 3 4; do head -c 400000 /dev/urandom > f$i.bin; done", "the patch is larger than"),
    ],
)
async def test_patch_collection_refuses_giant_files_and_patches(tmp_path: Path, script: str, reason: str) -> None:
    runner = HarnessAgentRunner(max_patch_bytes=1024 * 1024)
    spec = _spec(["sh", "-c", script])
    runtime = LocalRuntime(RuntimeSpec(file_size_limit="64m"), session_id="big", base_dir=tmp_path)
    await runtime.start()
    try:
        origin = "http://127.0.0.1:1"
        endpoints = ProxyEndpoints(token="t", anthropic_base_url=origin, openai_base_url=f"{origin}/v1",
                                   google_base_url=origin)  # fmt: skip
        prepared = await runner.prepare(runtime, spec, endpoints)
        run = await runner.run(runtime, prepared, timeout_s=60)
        with pytest.raises(PatchTooLarge, match=reason):
            await runner.collect(runtime, spec, run)
        # The sandbox still works and a small change is still collected.
        await runtime.exec(["sh", "-c", "rm -f *.bin; echo ok > small.txt"], cwd="workspace", timeout=30)
        runner2 = HarnessAgentRunner(max_patch_bytes=1024 * 1024)
        artifacts = await runner2.collect(runtime, spec, run)
        assert artifacts.patch is not None
        assert b"small.txt" in artifacts.patch
    finally:
        await runtime.stop()


@pytest.fixture(scope="module")
def docker_env() -> Iterator[Any]:
    with private_docker() as env:
        yield env


def _status_ids(pid: int) -> tuple[list[int], list[int]]:
    """The ``Uid:`` and ``Gid:`` lines of a host process (real, effective, saved, filesystem)."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    ids = {line.split(":")[0]: [int(x) for x in line.split()[1:]] for line in lines if line[:4] in ("Uid:", "Gid:")}
    return ids["Uid"], ids["Gid"]


async def _container_pids(client: Any, container_id: str | None, *, until: str) -> list[int]:
    """Host pids of a container's processes, once one of them runs ``until``."""
    for _ in range(100):
        top = await asyncio.to_thread(client.api.top, container_id)
        pid_col, cmd_col = top["Titles"].index("PID"), top["Titles"].index("CMD")
        if any(proc[cmd_col].startswith(until) for proc in top["Processes"]):
            return [int(proc[pid_col]) for proc in top["Processes"]]
        await asyncio.sleep(0.1)
    raise AssertionError(f"no process {until!r} in the container")


async def test_docker_sandbox_is_unprivileged_read_only_and_bounded(docker_env: Any) -> None:
    daemon, client, image = docker_env
    spec = RuntimeSpec(kind=RuntimeKind.DOCKER, image=image, docker_host=daemon.url, pids_limit=64)
    runtime = DockerRuntime(spec, session_id="redteam", client=client)
    await runtime.start()
    try:
        caps = await runtime.exec(["sh", "-c", "grep -E '^Cap(Eff|Prm)' /proc/self/status; id -u"], timeout=30)
        assert "CapEff:\t0000000000000000" in caps.stdout
        assert "CapPrm:\t0000000000000000" in caps.stdout
        assert caps.stdout.split()[-1] == "65534"
        # Read from the host while they run: no process of the container (the keeper included) is host uid 0.
        sleeper = asyncio.create_task(runtime.exec(["sleep", "30"], timeout=60))
        pids = await _container_pids(client, runtime.container_id, until="sleep")
        for pid in pids:
            uids, gids = _status_ids(pid)
            assert 0 not in uids, (pid, uids)
            assert 0 not in gids, (pid, gids)
        sleeper.cancel()
        root_write = await runtime.exec(["sh", "-c", "echo x > /etc/pwned"], timeout=30)
        assert root_write.exit_code != 0
        usr_write = await runtime.exec(["sh", "-c", "echo x > /usr/pwned"], timeout=30)
        assert usr_write.exit_code != 0
        own = await runtime.exec(["sh", "-c", "echo ok > mine.txt && cat mine.txt && echo t > /tmp/t"], timeout=30)
        assert own.ok, own.stderr
        assert own.stdout.strip() == "ok"
        await runtime.upload(b"data", "up/x.bin")
        edit = await runtime.exec(["sh", "-c", "echo more >> up/x.bin && cat up/x.bin"], timeout=30)
        assert edit.ok, edit.stderr
        forks = await runtime.exec(["python3", "-c",
                                    "import os, time\nn = 0\ntry:\n    for _ in range(500):\n"
                                    "        if os.fork() == 0:\n            time.sleep(3); os._exit(0)\n"
                                    "        n += 1\nexcept OSError:\n    pass\nprint(n)"], timeout=60)  # fmt: skip
        assert int(forks.stdout.split()[-1]) < 64
        container = client.containers.get(runtime.container_id)
        host_config = container.attrs["HostConfig"]
        assert host_config["ReadonlyRootfs"] is True
        assert host_config["CapDrop"] == ["ALL"]
        assert "no-new-privileges" in host_config["SecurityOpt"]
        assert host_config["PidsLimit"] == 64
    finally:
        await runtime.stop()


async def test_docker_attacks_fail(docker_env: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The attacks that apply to a container: network, credentials, signals, limits, links, disk quota."""
    daemon, client, image = docker_env
    canary = "canary-" + os.urandom(8).hex()
    monkeypatch.setenv(CANARY_NAME, canary)
    tcp, udp, targets = egress_targets()
    limits = {k: v for k, v in LIMITS.items() if k not in ("cpu_time_limit_s", "file_size_limit")}
    spec = RuntimeSpec(kind=RuntimeKind.DOCKER, image=image, docker_host=daemon.url, **limits)
    runtime = DockerRuntime(spec, session_id="redteam-attacks", client=client)
    env = {"NETWORK_PROBE": NETWORK_PROBE, "TARGETS": " ".join(targets), "SECRETS": "/nonexistent",
           "HOST_TARGET": "/etc/passwd"}  # fmt: skip
    await runtime.start()
    try:

        async def attack(name: str) -> ExecResult:
            return await runtime.exec(["sh", "-c", ATTACKS[name]], env=env, timeout=60)

        network = await attack("network")
        assert [line.split()[0] for line in network.stdout.splitlines()] == ["refused"] * len(targets), network
        assert sum(accepted(sock) for sock in tcp) + sum(received(sock) for sock in udp) == 0
        credentials = await attack("credentials")
        assert canary not in credentials.stdout
        # kill -9 -1 reaches only the command's own processes (it may kill its own wrapper), never the keeper: the
        # container keeps running, so the agent cannot turn its failure into a dead runtime (infra_error).
        await attack("kill_everything")
        assert (await runtime.exec(["true"], timeout=30)).ok
        assert (await attack("memory_bomb")).exit_code != 0
        before = await _process_count(runtime)
        assert not (await attack("fork_bomb")).timed_out
        # The bomb's processes outlive its command and die out by themselves (each failed fork ends one); until
        # they have, the next command may find no pid left ("Cannot fork"). The container must come back.
        await _until_processes_at_most(runtime, before)
        tmp = await attack("tmp_fill")
        assert int(tmp.stdout.split()[-1]) <= parse_size(LIMITS["tmp_size"])
        assert (await attack("plant_symlinks")).ok
        for link in ("shadow", "target"):
            with pytest.raises(NotFound):
                await runtime.download(link)
    finally:
        await runtime.stop()
        for sock in (*tcp, *udp):
            sock.close()
    quota_spec = dataclasses.replace(spec, disk_limit=QUOTA_LIMIT)
    disks = tmp_path / "disks"
    filler = DockerRuntime(quota_spec, session_id="redteam-fill", client=client, disk_dir=disks)
    await filler.start()
    try:
        if os.geteuid() == 0:
            # Root next to a local daemon: the session volume is an image of the quota's size, bind-mounted. The
            # write past it fails (ENOSPC), nothing lands past the quota on the host's disk; the session has
            # reached its quota (DiskQuotaExceeded, then for every later command).
            with pytest.raises(DiskQuotaExceeded, match="filled its disk quota"):
                await filler.exec(["sh", "-c", QUOTA_FILL], timeout=120)
            await asyncio.to_thread(os.sync)
            (image_file,) = disks.glob("*.img")
            assert image_file.stat().st_blocks * 512 <= parse_size(QUOTA_LIMIT)
            with pytest.raises(DiskQuotaExceeded):
                await filler.exec(["true"], timeout=30)
        else:
            with pytest.raises(DiskQuotaExceeded, match="disk quota"):
                await filler.exec(["sh", "-c", QUOTA_FILL], timeout=120)
            with pytest.raises(DiskQuotaExceeded):
                await filler.exec(["true"], timeout=30)
    finally:
        await filler.stop()
    assert not client.containers.list(all=True, filters={"label": "polar.session=redteam-fill"})
    assert not list(disks.glob("*"))  # the image is unmounted and deleted with its container


class _GiantPatchAgent(FakeAgentRunner):
    """A fake harness whose session ``giant`` left a workspace over the patch limit."""

    async def collect(self, runtime: Runtime, spec: SessionSpec, run: AgentRun) -> Artifacts:
        if spec.session_id == "giant":
            raise PatchTooLarge("the file big.bin is larger than the patch limit (1048576 bytes)")
        return await super().collect(runtime, spec, run)


async def test_a_giant_patch_is_invalid_patch_and_the_gateway_keeps_serving() -> None:
    proxy = FakeProxy()
    pipeline = SessionPipeline(
        PipelineConfig(step_retries=1),
        gateway_id="gw-redteam",
        runtimes=FakeRuntimeFactory(),
        agents=_GiantPatchAgent(proxy),
        proxy=proxy,
        reconstructor=FakeReconstructor(),
        evaluator=FakeEvaluator(),
        sink=RecordingSink(),
    )
    try:
        results = {}
        for session_id in ("giant", "next"):
            spec = SessionSpec(session_id=session_id, task_id="t", harness=HarnessConfig("fake"),
                               evaluator=EvaluatorConfig("script", {}))  # fmt: skip
            await pipeline.start_session(spec)
            results[session_id] = await pipeline.wait_done(session_id)
        assert results["giant"].status is TerminalStatus.INVALID_PATCH
        assert "larger than the patch limit" in results["giant"].error_message
        assert results["next"].status is not TerminalStatus.INVALID_PATCH
        assert results["next"].status is not TerminalStatus.INFRA_ERROR
    finally:
        await pipeline.close(grace_s=5)


class _DiskFillAgent(FakeAgentRunner):
    """A fake harness whose session ``filler`` breaks its sandbox's disk quota while it runs."""

    async def run(self, runtime: Runtime, prepared: Any, *, timeout_s: float) -> AgentRun:
        if runtime.session_id == "filler":
            await super().run(runtime, prepared, timeout_s=timeout_s)  # its model calls are recorded first
            raise DiskQuotaExceeded("the sandbox of filler used more than its disk quota (over 130 MiB allocated)")
        return await super().run(runtime, prepared, timeout_s=timeout_s)


async def test_a_disk_quota_breach_is_invalid_patch_with_its_calls_kept() -> None:
    proxy = FakeProxy()
    pipeline = SessionPipeline(
        PipelineConfig(step_retries=1),
        gateway_id="gw-redteam",
        runtimes=FakeRuntimeFactory(),
        agents=_DiskFillAgent(proxy),
        proxy=proxy,
        reconstructor=FakeReconstructor(),
        evaluator=FakeEvaluator(),
        sink=RecordingSink(),
    )
    try:
        results = {}
        for session_id in ("filler", "next"):
            spec = SessionSpec(session_id=session_id, task_id="t", harness=HarnessConfig("fake"),
                               evaluator=EvaluatorConfig("script", {}))  # fmt: skip
            await pipeline.start_session(spec)
            results[session_id] = await pipeline.wait_done(session_id)
        assert results["filler"].status is TerminalStatus.INVALID_PATCH  # the agent's doing: scored, not infra
        assert "disk quota" in results["filler"].error_message
        assert results["filler"].reward == 0.0
        assert results["filler"].traces  # the captured calls are reconstructed, with reward 0
        assert results["next"].status not in (TerminalStatus.INVALID_PATCH, TerminalStatus.INFRA_ERROR)
    finally:
        await pipeline.close(grace_s=5)
