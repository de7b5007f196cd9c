"""The Docker runtime: one container per session, driven through the Docker SDK.

Containers run ``sleep infinity`` under ``--init`` with ``--network none`` (unless the spec says otherwise),
no capabilities, ``no-new-privileges``, every command as an unprivileged user and the keeper as another
unprivileged user (which commands cannot signal): no process of the container is uid 0. A read-only root file
system (tmpfs ``/tmp``, the session directory on a volume), memory and pids limits, and a disk quota: where the
daemon is local and this process root, the session volume is a loop-mounted ext4 image of ``disk_limit`` bytes
bind-mounted into the container (:mod:`runtimes._diskimage`: the write past the quota fails with ``ENOSPC``),
elsewhere an anonymous volume under the watchdog of :mod:`runtimes._quota`; ``storage_opt`` size on the writable
layer when the root is writable and the storage driver supports it. Labels name the owner, so
:func:`reap_orphaned_containers` can remove containers whose owning process died. ``cancel`` and ``stop``
remove the container and its volume (``force``).
Commands run through ``docker exec`` wrapped in coreutils ``timeout``, which kills the command's whole
process group on timeout (and a small ``sh`` wrapper kills what is left in it when the command ends); the image
therefore needs ``sh``, ``timeout``, ``sleep`` and ``mkdir`` (coreutils or busybox).
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import io
import logging
import os
import socket
import tarfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import docker
import docker.errors
import docker.types

from polar_core.errors import InvalidArgument, NotFound
from runtimes._diskimage import SessionDisk, sweep, unsupported
from runtimes._limits import parse_size, unique_name
from runtimes._process import DOWNLOAD_LIMIT_BYTES
from runtimes._quota import allocated_bytes, quota_message, watch_quota
from runtimes._session import SESSION_SUBDIRS, SessionRuntime
from runtimes.base import ExecResult, resolve_in_root
from runtimes.errors import DiskQuotaExceeded, FileTooLarge, RuntimeDied
from runtimes.spec import NetworkMode, RuntimeSpec
from runtimes.tunnel import script_bytes, wrap_command

__all__ = [
    "LABEL_MANAGED",
    "LABEL_SESSION",
    "TUNNEL_DIR",
    "DockerRuntime",
    "container_name",
    "reap_orphaned_containers",
]

_log = logging.getLogger(__name__)

LABEL_MANAGED = "polar.managed"
LABEL_SESSION = "polar.session"
_LABEL_HOST = "polar.owner_host"
_LABEL_PID = "polar.owner_pid"
# Extra seconds docker exec may take beyond the command's own timeout before the container is presumed hung.
_EXEC_GRACE_S = 30.0
_TIMEOUT_EXIT_CODES = (124, 137)
# How many of a session id's characters a container name keeps (Docker's names stay under 64).
_NAME_SESSION_CHARS = 40
# In ``network: proxy`` mode the directory holding the bridge's socket is mounted here (read-only), and the
# forwarder (``runtimes/tunnel.py``, run by the image's ``python3``) listens on ``127.0.0.1:<proxy_port>``.
TUNNEL_DIR = "/polar/tunnel"
_FORWARDER = ".polar/tunnel.py"
_FORWARDER_READY_S = 20.0
# ``timeout`` leads a process group of its own; when the command ends, whatever it left in that group (a fork
# bomb's children, background jobs) is killed too, so one command cannot leave the container full of processes.
_REAP = 'timeout -k 5 "$0" "$@" & pid=$!; wait $pid; rc=$?; kill -9 -- -$pid 2>/dev/null; exit $rc'
DEFAULT_DISK_DIR = Path("/var/tmp/polar-disks")
"""Where session images go when the runtime is given no directory (on disk: never a tmpfs such as ``/tmp``)."""
_KEEPER_IDS = (65533, 65532)


def _keeper_user(sandbox_uid: int) -> str:
    """The keeper's ``uid:gid``: unprivileged, and not the sandbox user (whose commands could signal it)."""
    uid = next(u for u in _KEEPER_IDS if u != sandbox_uid)
    return f"{uid}:{uid}"


def container_name(session_id: str) -> str:
    """A fresh container name for a runtime of ``session_id``: ``polar-<session id>-<random>``.

    Unique per runtime, so a session's retried attempt, its evaluator's clean runtime and a second run of the
    same record on one Docker host never ask for a name in use (409 Conflict); the session id is kept, cut to
    Docker's name characters (``[a-zA-Z0-9][a-zA-Z0-9_.-]*``) and to 40 of them, for whoever reads
    ``docker ps``. Nothing looks a container up by this name: Polar finds its containers by their labels.
    """
    return unique_name(session_id, keep=_NAME_SESSION_CHARS)


def _owner_labels(session_id: str) -> dict[str, str]:
    return {
        LABEL_MANAGED: "true",
        LABEL_SESSION: session_id,
        _LABEL_HOST: socket.gethostname(),
        _LABEL_PID: str(os.getpid()),
    }


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_orphaned_containers(client: Any, *, all_owners: bool = False) -> list[str]:
    """Remove Polar containers whose owning process on this host is gone (or all of them).

    Args:
        client: A ``docker.DockerClient``.
        all_owners: Remove every Polar-managed container on this host, owner alive or not.

    Returns:
        The names of the removed containers.
    """
    removed: list[str] = []
    host = socket.gethostname()
    for container in client.containers.list(all=True, filters={"label": f"{LABEL_MANAGED}=true"}):
        labels = container.labels
        if labels.get(_LABEL_HOST) != host:
            continue
        pid = int(labels.get(_LABEL_PID, "0") or 0)
        if all_owners or not _pid_alive(pid):
            try:
                container.remove(force=True, v=True)
            except docker.errors.NotFound:
                continue
            removed.append(container.name)
    return removed


def _dirs_tar(names: Sequence[str], uid: int, gid: int) -> bytes:
    """An archive of ``names`` as directories owned by ``uid:gid``."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.uid, info.gid, info.mtime = tarfile.DIRTYPE, 0o755, uid, gid, int(time.time())
            tar.addfile(info)
    return buf.getvalue()


def _tar_of(src: Path | bytes, name: str, exclude: Sequence[str], owner: tuple[int, int]) -> bytes:
    uid, gid = owner
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        if isinstance(src, bytes):
            info = tarfile.TarInfo(name)
            info.size = len(src)
            info.mode = 0o644
            info.uid, info.gid = uid, gid
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(src))
        else:

            def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
                base = PurePosixPath(info.name).name
                if any(fnmatch.fnmatch(base, pat) for pat in exclude):
                    return None
                info.uid, info.gid, info.uname, info.gname = uid, gid, "", ""
                return info

            tar.add(str(src), arcname=name, filter=keep)
    return buf.getvalue()


class DockerRuntime(SessionRuntime):
    """A container per session.

    Args:
        spec: The runtime spec (``kind`` docker, ``image`` set).
        session_id: The session; it labels the container (``polar.session``) and begins its name, which is
            unique per runtime (:func:`container_name`).
        client: A ``docker.DockerClient``; built from ``spec.docker_host`` when omitted.
        disk_dir: Where this host keeps session images (a local daemon, started as root); the factory passes
            ``<base_dir>/.polar-disks``.
    """

    def __init__(
        self, spec: RuntimeSpec, *, session_id: str, client: Any | None = None, disk_dir: Path = DEFAULT_DISK_DIR
    ) -> None:
        super().__init__(spec, session_id=session_id)
        self._client = client
        self._disk_dir = disk_dir
        self._disk: SessionDisk | None = None
        self._container: Any | None = None
        self._root = PurePosixPath(spec.container_root)
        self._volume_host_dir: Path | None = None
        self._user = f"{spec.sandbox_uid}:{spec.sandbox_gid}"
        self._quota_breach: str | None = None
        self._name = container_name(session_id)

    @property
    def container_name(self) -> str:
        """The container's name (fresh for every runtime, also before it starts)."""
        return self._name

    @property
    def root(self) -> PurePosixPath:
        """The session directory inside the container."""
        return self._root

    @property
    def container_id(self) -> str | None:
        """The container's id once started."""
        return None if self._container is None else str(self._container.id)

    def _docker(self) -> Any:
        if self._client is None:
            self._client = (
                docker.DockerClient(base_url=self._spec.docker_host) if self._spec.docker_host else docker.from_env()
            )
        return self._client

    async def start(self) -> None:
        """Create and start the container, and the session directory in it."""
        self._raise_if_cancelled()
        if self._container is not None:
            return
        try:
            if self._image_dir() is not None:
                await asyncio.to_thread(sweep)
                self._disk = await asyncio.to_thread(
                    SessionDisk.create, self._disk_dir, self._name,
                    parse_size(self._spec.disk_limit or 0), owner=(0, 0),
                )  # fmt: skip
            self._container = await asyncio.to_thread(self._run_container)
        except BaseException:
            await self._remove_disk()
            raise
        self._volume_host_dir = await asyncio.to_thread(self._readable_volume_dir)
        # The session directory lives in a fresh volume (owned by root) mounted on its parent; an archive makes it
        # and its standard subdirectories the sandbox user's, without giving the container a capability to chown.
        names = [self._root.name, *(f"{self._root.name}/{sub}" for sub in SESSION_SUBDIRS)]
        await self._put(self._volume_target(), _dirs_tar(names, self._spec.sandbox_uid, self._spec.sandbox_gid))
        if self._spec.network is NetworkMode.PROXY:
            await self._start_forwarder()

    async def _start_forwarder(self) -> None:
        """Start the in-container end of the proxy tunnel once, and wait until it listens."""
        spec = self._spec
        if spec.proxy_socket is None:
            raise RuntimeDied("network 'proxy' without a proxy socket")
        await self.upload(script_bytes(), _FORWARDER)
        socket_path = f"{TUNNEL_DIR}/{spec.proxy_socket.name}"
        argv = wrap_command("python3", str(self._root / _FORWARDER), port=spec.proxy_port, socket_path=socket_path,
                            argv=())  # fmt: skip
        container = self._live()
        await asyncio.to_thread(
            container.exec_run, argv, workdir="/", environment=self.environment(None), detach=True, user=self._user
        )
        probe = (
            "import socket, sys, time\n"
            "for _ in range(100):\n"
            "    try:\n"
            f"        socket.create_connection(('127.0.0.1', {spec.proxy_port}), timeout=1).close(); sys.exit(0)\n"
            "    except OSError:\n"
            "        time.sleep(0.1)\n"
            "sys.exit(1)\n"
        )
        ready = await self._exec_in(container, ["python3", "-c", probe], "/", None, _FORWARDER_READY_S)
        if not ready.ok:
            raise RuntimeDied(
                f"the proxy forwarder did not start in {self._session_id} (the image needs python3): "
                f"{(ready.stderr or ready.stdout).strip()[-300:]}"
            )

    def _image_dir(self) -> Path | None:
        """Where this session's image goes, or ``None`` where the volume gets the watchdog instead."""
        if self._spec.disk_limit is None or unsupported() is not None:
            return None
        # Only a daemon on this host (a Unix socket) mounts what this process mounted.
        base_url = str(getattr(getattr(self._docker(), "api", None), "base_url", ""))
        return self._disk_dir if base_url.startswith("http+docker://") else None

    async def _remove_disk(self) -> None:
        disk, self._disk = self._disk, None
        if disk is not None:
            await asyncio.to_thread(disk.remove)

    def _volume_target(self) -> PurePosixPath:
        """Where the session volume is mounted: the session directory's parent (``/polar``)."""
        if self._root.parent == PurePosixPath("/"):
            raise InvalidArgument(f"container_root {self._root} needs a parent directory other than /")
        return self._root.parent

    def _run_container(self) -> Any:
        network = "host" if self._spec.network is NetworkMode.HOST else "none"
        kwargs: dict[str, Any] = {
            "command": ["sleep", "infinity"],
            "detach": True,
            "init": True,
            "name": self._name,
            "labels": _owner_labels(self._session_id),
            "network_mode": network,
            "mem_limit": self._spec.memory_limit,
            "pids_limit": self._spec.pids_limit,
            "working_dir": "/",
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            # The keeper (init and ``sleep infinity``) runs as an unprivileged user other than the sandbox's: a
            # command cannot signal it, so ``kill -9 -1`` cannot end its own container; nothing runs as uid 0.
            "user": _keeper_user(self._spec.sandbox_uid),
            "read_only": self._spec.read_only_root,
            "tmpfs": {"/tmp": f"size={parse_size(self._spec.tmp_size)},mode=1777,exec"},
            # An anonymous volume (removed with the container): writable under a read-only root, and reachable
            # by put_archive/get_archive, which a tmpfs is not. With a session image, that image's mount instead.
            "mounts": [
                docker.types.Mount(target=str(self._volume_target()), source=str(self._disk.mountpoint), type="bind")
                if self._disk is not None
                else docker.types.Mount(target=str(self._volume_target()), source=None, type="volume")
            ],
        }
        if self._spec.cpus is not None:
            kwargs["nano_cpus"] = int(self._spec.cpus * 1e9)
        volumes: dict[str, dict[str, str]] = {
            str(p): {"bind": str(p), "mode": "ro"} for p in self._spec.read_only_paths
        }
        if self._spec.network is NetworkMode.PROXY and self._spec.proxy_socket is not None:
            # The container has no network; the proxy's Unix socket is its only way out. Its directory is
            # mounted (not the socket file), so a bridge that re-creates the socket stays reachable.
            volumes[str(self._spec.proxy_socket.parent)] = {"bind": TUNNEL_DIR, "mode": "ro"}
        kwargs["volumes"] = volumes
        if not self._spec.read_only_root and self._spec.disk_limit is not None:
            # The writable layer, where the driver can bound it (overlay2 on xfs with pquota, btrfs, zfs).
            kwargs["storage_opt"] = {"size": self._spec.disk_limit}
        try:
            try:
                return self._docker().containers.run(self._spec.image, **kwargs)
            except docker.errors.APIError as exc:
                if "storage_opt" not in kwargs or "storage" not in str(exc).lower():
                    raise
                _log.warning("docker runtime: the storage driver cannot bound the writable layer of %s (%s); "
                             "only the session volume has a disk quota", self._session_id, exc)  # fmt: skip
                del kwargs["storage_opt"]
                with contextlib.suppress(docker.errors.DockerException):
                    self._docker().containers.get(kwargs["name"]).remove(force=True, v=True)
                return self._docker().containers.run(self._spec.image, **kwargs)
        except docker.errors.ImageNotFound as exc:
            raise NotFound(f"image {self._spec.image!r} not found: {exc}") from None
        except docker.errors.DockerException as exc:
            raise RuntimeDied(f"cannot start a container from {self._spec.image!r}: {exc}") from None

    async def stop(self) -> None:
        """Remove the container and its session volume. Idempotent."""
        container, self._container = self._container, None
        if container is not None:
            await asyncio.to_thread(_remove, container)
        await self._remove_disk()

    def _live(self) -> Any:
        self._raise_unless_started(self._container is not None)
        return self._container

    async def exec(
        self,
        argv: Sequence[str],
        *,
        cwd: str | PurePosixPath | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float,  # noqa: ASYNC109 - enforced inside the sandbox, which kills the process group
    ) -> ExecResult:
        """Run a command in the container; see :meth:`runtimes.base.Runtime.exec`."""
        if self._quota_breach is not None:
            raise DiskQuotaExceeded(self._quota_breach)
        container = self._live()
        workdir = str(resolve_in_root(self._root, cwd)) if cwd is not None else str(self._root)
        command = self._exec_in(container, argv, workdir, env, timeout)
        if self._disk is not None:
            # An image of the quota's size refuses the write past it (ENOSPC); a container that filled it has reached
            # its quota, and the session ends as with the watchdog, with nothing written past the quota.
            result = await command
            disk = self._disk  # None once the runtime was stopped while the command ran
            if disk is not None and await asyncio.to_thread(disk.full):
                self._quota_breach = disk.quota_message(f"the container of {self._session_id}")
                _log.warning("docker runtime: %s", self._quota_breach)
                raise DiskQuotaExceeded(self._quota_breach)
            return result
        if self._spec.disk_limit is None:
            return await command
        limit = parse_size(self._spec.disk_limit)
        try:
            result, _breach = await watch_quota(
                command, measure=lambda: self._disk_usage(container, limit), limit=limit, on_exceeded=self._over_quota
            )
        except RuntimeDied:
            if self._quota_breach is None:
                raise
        if self._quota_breach is not None:
            raise DiskQuotaExceeded(self._quota_breach)
        return result

    def _readable_volume_dir(self) -> Path | None:
        """The session volume's directory on this host, when the daemon is local and this process may read it."""
        if self._spec.docker_host is not None and not self._spec.docker_host.startswith("unix://"):
            return None
        if self._container is None:
            return None
        for mount in self._container.attrs.get("Mounts", []):
            if mount.get("Destination") == str(self._volume_target()) and mount.get("Source"):
                source = Path(mount["Source"])
                if os.access(source, os.R_OK | os.X_OK):
                    return source
        return None

    async def _disk_usage(self, container: Any, limit: int) -> int:
        """Allocated bytes of the session volume: walked on the host where readable, else ``du`` inside."""
        if self._volume_host_dir is not None:
            return await asyncio.to_thread(allocated_bytes, self._volume_host_dir, stop_above=limit)
        argv = ["du", "-skx", str(self._volume_target())]
        try:
            done = await asyncio.to_thread(container.exec_run, argv, demux=True, user=self._user)
        except docker.errors.DockerException:
            return 0  # the container is going away; the command's own result says so
        out = (done.output[0] or b"").split()
        return int(out[0]) * 1024 if out and out[0].isdigit() else 0

    async def _over_quota(self, used: int) -> None:
        """The quota broke: remember why and kill the container (every process in it)."""
        limit = parse_size(self._spec.disk_limit or 0)
        self._quota_breach = quota_message(used, limit, f"the container of {self._session_id}")
        _log.warning("docker runtime: %s; the container is killed", self._quota_breach)
        container = self._container
        if container is not None:
            try:
                await asyncio.to_thread(container.kill)
            except docker.errors.DockerException as exc:
                _log.warning("cannot kill container %s: %s", container.name, exc)

    async def _exec_in(
        self,
        container: Any,
        argv: Sequence[str],
        workdir: str,
        env: Mapping[str, str] | None,
        timeout: float,  # noqa: ASYNC109 - enforced inside the sandbox, which kills the process group
    ) -> ExecResult:
        wrapped = ["sh", "-c", _REAP, f"{timeout:.3f}", *argv]
        started = time.monotonic()
        try:
            exit_code, (out, err) = await asyncio.wait_for(
                asyncio.to_thread(self._exec_blocking, container, wrapped, workdir, self.environment(env), self._user),
                timeout + _EXEC_GRACE_S,
            )
        except TimeoutError:
            await self.stop()
            raise RuntimeDied(f"docker exec hung past its timeout in {self._session_id}") from None
        except docker.errors.DockerException as exc:
            self._raise_if_cancelled(" while a command ran")
            raise RuntimeDied(f"docker exec failed in {self._session_id}: {exc}") from None
        duration = time.monotonic() - started
        self._raise_if_cancelled(" while a command ran")
        if exit_code is None or not await asyncio.to_thread(_running, container):
            raise RuntimeDied(f"container of {self._session_id} died while a command ran")
        timed_out = exit_code in _TIMEOUT_EXIT_CODES and duration >= timeout - 0.5
        return ExecResult(
            exit_code=int(exit_code),
            stdout=(out or b"").decode("utf-8", errors="replace"),
            stderr=(err or b"").decode("utf-8", errors="replace"),
            timed_out=timed_out,
            duration_s=duration,
        )

    @staticmethod
    def _exec_blocking(
        container: Any, argv: list[str], workdir: str, env: dict[str, str], user: str
    ) -> tuple[int | None, tuple[bytes | None, bytes | None]]:
        result = container.exec_run(argv, workdir=workdir, environment=env, demux=True, user=user)
        return result.exit_code, result.output

    async def upload(self, src: Path | bytes, dest: str | PurePosixPath, *, exclude: Sequence[str] = ()) -> None:
        """Copy a host file/directory or bytes below the session directory (``put_archive``)."""
        self._live()
        target = resolve_in_root(self._root, dest)
        mkdir = await self.exec(["mkdir", "-p", str(target.parent)], timeout=60.0)
        if not mkdir.ok:
            raise RuntimeDied(f"cannot create {target.parent} in the container: {mkdir.stderr}")
        owner = (self._spec.sandbox_uid, self._spec.sandbox_gid)
        data = await asyncio.to_thread(_tar_of, src, target.name, tuple(exclude), owner)
        await self._put(target.parent, data)

    async def _put(self, directory: PurePosixPath, data: bytes) -> None:
        container = self._live()
        try:
            ok = await asyncio.to_thread(container.put_archive, str(directory), data)
        except docker.errors.DockerException as exc:
            self._raise_if_cancelled(" while a command ran")
            raise RuntimeDied(f"upload to {directory} failed: {exc}") from None
        if not ok:
            raise RuntimeDied(f"upload to {directory} failed")

    async def download(self, src: str | PurePosixPath) -> bytes:
        """Read a regular file below the session directory (``get_archive``)."""
        container = self._live()
        source = resolve_in_root(self._root, src)
        try:
            data = await asyncio.to_thread(_get_file, container, str(source))
        except docker.errors.NotFound:
            raise NotFound(f"no file {source} in the container") from None
        except docker.errors.DockerException as exc:
            self._raise_if_cancelled(" while a command ran")
            raise RuntimeDied(f"download of {source} failed: {exc}") from None
        if data is None:
            raise NotFound(f"{source} is not a regular file")
        return data


def _get_file(container: Any, path: str) -> bytes | None:
    stream, stat = container.get_archive(path)
    if int(stat.get("size", 0)) > DOWNLOAD_LIMIT_BYTES:
        close = getattr(stream, "close", None)
        if close is not None:
            close()
        raise FileTooLarge(f"{path} is larger than the download limit ({DOWNLOAD_LIMIT_BYTES} bytes)")
    buf = io.BytesIO(b"".join(stream))
    with tarfile.open(fileobj=buf, mode="r") as tar:
        member = tar.next()
        if member is None or not member.isfile():
            return None
        fh = tar.extractfile(member)
        return None if fh is None else fh.read()


def _running(container: Any) -> bool:
    try:
        container.reload()
    except docker.errors.NotFound:
        return False
    return bool(container.status == "running")


def _remove(container: Any) -> None:
    try:
        container.remove(force=True, v=True)
    except docker.errors.NotFound:
        return
    except docker.errors.APIError as exc:
        # "removal already in progress" is fine; anything else is worth a log line, not a crash on cleanup.
        _log.warning("cannot remove container %s: %s", container.name, exc)
