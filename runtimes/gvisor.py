"""The gVisor runtime (``isolation: gvisor``): a local session directory, commands under a user-space kernel.

bubblewrap and Docker share the host kernel: every system call of the sandbox reaches it. Under gVisor's ``runsc``
the sandbox's system calls are served by gVisor's own kernel (the Sentry, a Go program), which in turn uses a small,
seccomp-filtered set of host calls; a bug in the host kernel's system-call surface is out of the agent's reach.

One sandbox per session: ``runsc run --detach`` of an OCI bundle kept outside the session directory
(``<base_dir>/.polar-gvisor/<name>/``, mode 0700: ``config.json``, a read-only root with a generated ``/etc``, the
``runsc`` state). The root shows, read-only, the system directories and the Python in use (as the bubblewrap
sandbox does), a private ``/etc`` (:data:`runtimes.local._ETC_ALLOWED` plus generated ``passwd``/``group``/
``hosts``/``hostname``), tmpfs ``/tmp`` and ``/dev/shm`` of ``tmp_size``, and the session directory read-write at
``container_root``. Commands run with ``runsc exec`` as ``sandbox_uid:sandbox_gid`` (root) or, for an ordinary
user, as id 0 of a user namespace the session owns (:mod:`runtimes._userns`; every ``runsc`` call enters it with
``--rootless``, as ``runsc do`` does; that id is the user's own on the host, and gVisor's ``/dev`` is handed to
``nobody`` so that owning every other file gains nothing), with no capability, a clean environment, and the
per-process limits applied inside gVisor (``prlimit``: ``RLIMIT_AS`` for memory, since gVisor does not count
``mmap`` in ``RLIMIT_DATA``; ``RLIMIT_NPROC``, which gVisor counts per sandbox, for processes; CPU time, file
size, open files, no core). Where this host can make one, a memory cgroup holds the whole sandbox (``runsc``
itself is told ``--ignore-cgroups``: its own cgroup set-up fails here) as a backstop: past it the host kills gVisor
and the runtime reports :class:`~runtimes.errors.RuntimeDied`. No pids backstop: the Sentry panics when the host
refuses it a thread.

Network: ``--network=none`` (gVisor's own loopback only) or ``host``; ``network: proxy`` binds the proxy's Unix
socket at ``/run/polar/proxy.sock`` (``--host-uds=open`` lets the sandbox connect to it, nothing more) and wraps each
command in the forwarder of :mod:`runtimes.tunnel`, as the local runtime does. The workspace disk quota is the
watchdog of :mod:`runtimes._quota`. Platform ``ptrace``: the Debian build (2022-12) has no ``systrap``, and ``kvm``
needs ``/dev/kvm`` and nested virtualisation (on a Firecracker VM it hangs).

:func:`probe_gvisor` runs ``true`` in a sandbox like the sessions'; :meth:`GVisorRuntime.start` refuses with
:class:`~runtimes.errors.IsolationUnavailable` naming what ``runsc`` said when it cannot run here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from runtimes._hostdir import HostSessionDir
from runtimes._limits import parse_size, prlimit_argv, probe_limits, remove_cgroups, unique_name
from runtimes._process import run_process
from runtimes._quota import allocated_bytes, quota_message, watch_quota
from runtimes._session import SESSION_SUBDIRS, SessionRuntime
from runtimes._userns import OwnUserNamespace
from runtimes.base import ExecResult
from runtimes.errors import DiskQuotaExceeded, IsolationUnavailable, RuntimeDied
from runtimes.local import _DEFAULT_PATH, _ETC_ALLOWED, _FORWARDER, _PROXY_SOCKET, _SANDBOX_HOSTNAME, _write_etc
from runtimes.spec import NetworkMode, RuntimeSpec
from runtimes.tunnel import script_bytes, wrap_command

__all__ = ["GVisorRuntime", "probe_gvisor", "runsc_flags"]

_log = logging.getLogger(__name__)

PLATFORM = "ptrace"
"""gVisor's platform: how the Sentry intercepts the sandbox's system calls (see the module docstring)."""
_PRIVATE = ".polar-gvisor"
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt")
# runsc exec's own failures (the sandbox gone, the container stopped) exit 128, as no command of ours does alone.
_RUNSC_FAILED = 128
_EXEC_GRACE_S = 30.0
_TIMEOUT_EXIT_CODE = 124
# Each command runs under runtimes/_reaper.py, kept in the sandbox's read-only root: it kills whatever the command
# left behind: every process of the command's session (a process-group kill misses reparented processes here).
_REAPER = "/.polar/reaper.py"
# pid 1 of the sandbox: reaps every orphan (gVisor hands them to pid 1; unreaped zombies would hold RLIMIT_NPROC).
_KEEPER = (
    "import os, signal\nsignal.signal(signal.SIGCHLD, lambda *_: None)\nwhile True:\n    try:\n"
    "        os.wait()\n    except ChildProcessError:\n        signal.pause()\n"
)
# What gVisor itself needs beyond the sandbox's own memory (the Sentry, the gofer, ptrace stubs). No pids backstop:
# the Sentry panics when the host refuses it a thread (a fork bomb's churn reached 4096 extra host tasks).
_BACKSTOP_MEMORY = 512 * 1024**2
_BACKSTOP_PIDS = 1_000_000
_CGROUP_JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1/cgroup.procs" || exit 126; shift; done; shift; exec "$@"'


def _is_root() -> bool:
    return os.geteuid() == 0


def runsc_flags(state_dir: Path, network: NetworkMode) -> list[str]:
    """The global ``runsc`` flags every call of one sandbox uses."""
    flags = ["runsc", "--root", str(state_dir), f"--platform={PLATFORM}", "--ignore-cgroups",
             f"--network={'host' if network is NetworkMode.HOST else 'none'}", "--host-uds=open"]  # fmt: skip
    if not _is_root():
        flags.append("--rootless")
    return flags


async def probe_gvisor() -> str | None:
    """``None`` when a gVisor sandbox like the sessions' runs here (a bundle started and ``true`` run in it, with
    the runtime's flags); else why not (runsc missing, or what it said)."""
    if shutil.which("runsc", path=_DEFAULT_PATH) is None:
        return "gVisor (runsc) is not installed"
    with tempfile.TemporaryDirectory(prefix="polar-runsc-probe-") as base:
        runtime = GVisorRuntime(RuntimeSpec(disk_limit=None), session_id="probe", base_dir=Path(base))
        try:
            await runtime.start()
            result = await runtime.exec(["true"], timeout=30.0)
        except IsolationUnavailable as exc:
            return str(exc).removeprefix(_UNAVAILABLE)
        except (OSError, RuntimeDied) as exc:
            return f"runsc cannot run a command in its sandbox: {exc}"
        finally:
            await runtime.stop()
    if result.ok:
        return None
    detail = (result.stderr or result.stdout).strip()[-300:] or f"exit status {result.exit_code}"
    return f"runsc cannot run a command in its sandbox: {detail}"


_UNAVAILABLE = "isolation 'gvisor' is not available here: "


class GVisorRuntime(SessionRuntime):
    """A session directory under ``base_dir`` with commands run in a gVisor sandbox of its own.

    Args:
        spec: The runtime spec (``kind`` local, ``isolation`` or ``min_isolation`` gvisor).
        session_id: Names the session directory (``base_dir/session_id``).
        base_dir: Parent of session directories; the sandboxes' bundles go in ``base_dir/.polar-gvisor``.
    """

    _unenforced_logged: ClassVar[bool] = False  # what the host cannot enforce is logged by the first session

    def __init__(self, spec: RuntimeSpec, *, session_id: str, base_dir: Path) -> None:
        super().__init__(spec, session_id=session_id)
        host_root = (base_dir / session_id).absolute()
        self._dir = HostSessionDir(host_root, PurePosixPath(spec.container_root))
        # The sandbox id names runsc's abstract control socket: unique on this host, not only per base_dir.
        self._id = unique_name(session_id, keep=40)
        self._private = (base_dir / _PRIVATE / self._id).absolute()
        self._started = False
        self._limits = probe_limits()
        self._cgroups: list[Path] = []
        self._quota_breach: str | None = None
        # An ordinary user is id 0 of the user namespace runsc runs in, its only id: the sandbox's is 0 too.
        self._uid, self._gid = (spec.sandbox_uid, spec.sandbox_gid) if _is_root() else (0, 0)
        # An ordinary user's runsc calls run as root of a user namespace of the session's own (runtimes._userns).
        self._userns: OwnUserNamespace | None = None

    @property
    def root(self) -> PurePosixPath:
        """The session directory as commands see it: ``container_root``."""
        return self._dir.inner_root

    @property
    def host_root(self) -> Path:
        """The session directory on the host."""
        return self._dir.host_root

    @property
    def sandbox_id(self) -> str:
        """The gVisor container id (``runsc --root <state> list``)."""
        return self._id

    def _flags(self) -> list[str]:
        enter = self._userns.enter_argv() if self._userns is not None else []
        return [*enter, *runsc_flags(self._private / "state", self._spec.network)]

    async def start(self) -> None:
        """Create the session directory and the bundle, then start the sandbox (the full check that a sandbox runs
        here is :func:`probe_gvisor`, run once by the gateway and the evaluator, not per session).

        Raises:
            IsolationUnavailable: runsc is missing or cannot create a sandbox on this host (the message says why).
        """
        self._raise_if_cancelled()
        if self._started:
            return
        if shutil.which("runsc", path=_DEFAULT_PATH) is None:
            raise IsolationUnavailable(_UNAVAILABLE + "gVisor (runsc) is not installed")
        root = self.host_root
        for sub in SESSION_SUBDIRS:
            (root / sub).mkdir(parents=True, exist_ok=True)
        if self._spec.network is NetworkMode.PROXY:
            (root / _FORWARDER).write_bytes(script_bytes())
        await asyncio.to_thread(self._own_tree, root)
        await asyncio.to_thread(self._write_bundle)
        if not _is_root() and self._userns is None:
            try:
                self._userns = await OwnUserNamespace.start(sys.executable)
            except RuntimeDied as exc:
                await self._destroy()
                raise IsolationUnavailable(f"{_UNAVAILABLE}{exc}") from exc
        try:
            self._cgroups = await asyncio.to_thread(
                self._limits.cgroups.create,
                self._session_id,
                pids_max=self._spec.pids_limit + _BACKSTOP_PIDS,
                memory_max=parse_size(self._spec.memory_limit) + _BACKSTOP_MEMORY,
            )
        except OSError as exc:
            _log.warning("gvisor runtime %s: no cgroup (%s); only the limits inside gVisor apply", self._session_id,
                         exc)  # fmt: skip
        self._log_unenforced_once()
        await self._run_sandbox()
        self._started = True

    def _log_unenforced_once(self) -> None:
        """Say, once per process, what this host cannot enforce around a gVisor sandbox (the limits inside hold)."""
        if GVisorRuntime._unenforced_logged:
            return
        GVisorRuntime._unenforced_logged = True
        if not self._cgroups:
            _log.warning("gvisor runtime: not enforced on this host: a memory and process backstop around the whole "
                         "sandbox (no cgroup here; the per-process limits inside gVisor hold)")  # fmt: skip
        _log.warning("gvisor runtime: not enforced on this host: a hard disk quota (a watchdog kills a sandbox over "
                     "its quota after the fact)")  # fmt: skip

    async def _run_sandbox(self) -> None:
        join = ["sh", "-c", _CGROUP_JOIN, "polar-cgroup", *map(str, self._cgroups), "--"] if self._cgroups else []
        argv = [*join, *self._flags(), "run", "--bundle", str(self._private / "bundle"), "--detach", self._id]
        log = self._private / "run.log"
        # Not run_process: the detached sandbox keeps the pipes and the process group of ``runsc run``.
        with log.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=err,
                env={"PATH": _DEFAULT_PATH},
                start_new_session=True,
            )
            try:
                code = await asyncio.wait_for(proc.wait(), 60.0)
            except TimeoutError:
                proc.kill()
                code = -1
        if code != 0:
            detail = log.read_text(errors="replace").strip()[-300:] or f"exit status {code}"
            await self._destroy()
            raise IsolationUnavailable(f"{_UNAVAILABLE}runsc run failed: {detail}")
        if not _is_root():
            await self._hand_dev_away()

    async def _hand_dev_away(self) -> None:
        """Give gVisor's ``/dev`` to ``nobody`` (an ordinary user's sandbox runs as id 0, its only id).

        Without it a command, owner of ``/dev``, could fill that directory, which no size bounds (gVisor ignores a
        ``/dev`` mount's options) and which lives in the Sentry's memory. Nobody's ``/dev`` (mode 0755) takes no new
        file, and a command without capabilities cannot take it back. ``/dev/shm`` and ``/tmp`` stay as sized.
        """
        done = await self._runsc(["exec", "--user", "0:0", "--cap", "CAP_CHOWN", self._id, "chown", "65534:65534",
                                  "/dev"])  # fmt: skip
        if done is None or not done.ok:
            detail = "runsc did not start" if done is None else (done.stderr or done.stdout).strip()[-300:]
            await self._destroy()
            raise IsolationUnavailable(f"{_UNAVAILABLE}cannot make the sandbox's /dev read-only to it: {detail}")

    def _own_tree(self, path: Path) -> None:
        """Give the sandbox user what the host wrote into the session directory (root only: else it is ours)."""
        if not _is_root():
            return
        os.lchown(path, self._uid, self._gid)
        if path.is_dir() and not path.is_symlink():
            for dirpath, dirnames, filenames in os.walk(path):
                for name in (*dirnames, *filenames):
                    os.lchown(os.path.join(dirpath, name), self._uid, self._gid)

    def _read_only_paths(self) -> list[Path]:
        paths = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent.parent]
        paths.extend(self._spec.read_only_paths)
        seen: list[Path] = []
        for path in paths:
            if path.exists() and path not in seen and str(path) not in _SYSTEM_DIRS:
                seen.append(path)
        return seen

    def _write_bundle(self) -> None:
        """``config.json`` and the read-only root (mount points, a private ``/etc``) of the sandbox."""
        bundle = self._private / "bundle"
        rootfs = bundle / "rootfs"
        self._private.mkdir(parents=True, exist_ok=True, mode=0o700)
        (self._private / "state").mkdir(exist_ok=True, mode=0o700)
        rootfs.mkdir(parents=True, exist_ok=True)
        _write_etc(rootfs / "etc", self._uid, self._gid)
        (rootfs / ".polar").mkdir(exist_ok=True)
        shutil.copyfile(Path(__file__).with_name("_reaper.py"), rootfs / _REAPER.lstrip("/"))
        mounts: list[dict[str, Any]] = [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            _tmpfs("/tmp", self._spec.tmp_size),
            _tmpfs("/dev/shm", self._spec.tmp_size),
        ]
        for name in _SYSTEM_DIRS:
            path = Path(name)
            if path.is_symlink():
                (rootfs / name.lstrip("/")).symlink_to(os.readlink(path))
            elif path.is_dir():
                mounts.append(_bind(path, path, read_only=True))
        etc = [*_ETC_ALLOWED, "resolv.conf"] if self._spec.network is NetworkMode.HOST else _ETC_ALLOWED
        for rel in etc:
            host = Path("/etc") / rel
            if host.exists():
                mounts.append(_bind(host.resolve(), PurePosixPath("/etc") / rel, read_only=True))
        for path in self._read_only_paths():
            mounts.append(_bind(path, path, read_only=True))
        mounts.append(_bind(self.host_root, self.root, read_only=False))
        if self._spec.network is NetworkMode.PROXY and self._spec.proxy_socket is not None:
            mounts.append(_bind(self._spec.proxy_socket, PurePosixPath(_PROXY_SOCKET), read_only=False))
        for mount in mounts:
            if mount["type"] == "bind":
                _mount_point(rootfs, mount["destination"], directory=Path(mount["source"]).is_dir())
            else:
                _mount_point(rootfs, mount["destination"], directory=True)
        linux: dict[str, Any] = {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")]}
        none: list[str] = []
        config = {
            "ociVersion": "1.0.0",
            "root": {"path": "rootfs", "readonly": True},
            "hostname": _SANDBOX_HOSTNAME,
            "process": {
                "terminal": False,
                # The keeper: pid 1 of the sandbox, another user than the commands', so a command's ``kill -9 -1``
                # cannot end the sandbox (and turn its failure into a dead runtime).
                "user": {"uid": 0 if _is_root() else self._uid, "gid": 0 if _is_root() else self._gid},
                "args": [sys.executable, "-c", _KEEPER],
                "cwd": "/",
                "env": [f"PATH={_DEFAULT_PATH}"],
                "capabilities": {k: none for k in ("bounding", "effective", "permitted", "inheritable", "ambient")},
                "noNewPrivileges": True,
            },
            "mounts": mounts,
            "linux": linux,
        }
        (bundle / "config.json").write_text(json.dumps(config, indent=1))

    async def stop(self) -> None:
        """Destroy the sandbox and delete the session directory. Idempotent."""
        self._started = False
        await self._destroy()
        await asyncio.to_thread(shutil.rmtree, self.host_root, True)

    async def _destroy(self) -> None:
        if (self._private / "state").is_dir():
            await self._runsc(["kill", "--all", self._id, "KILL"])
            await self._runsc(["delete", "--force", self._id])
        await asyncio.to_thread(shutil.rmtree, self._private, True)
        userns, self._userns = self._userns, None
        if userns is not None:
            await userns.stop()
        cgroups, self._cgroups = self._cgroups, []
        await asyncio.to_thread(remove_cgroups, cgroups)

    async def _runsc(self, args: Sequence[str], timeout: float = 30.0) -> ExecResult | None:  # noqa: ASYNC109
        try:
            return await run_process([*self._flags(), *args], cwd=None, env={"PATH": _DEFAULT_PATH}, timeout=timeout)
        except OSError:
            return None

    async def _running(self) -> bool:
        state = await self._runsc(["state", self._id])
        if state is None or not state.ok:
            return False
        try:
            return bool(json.loads(state.stdout).get("status") == "running")
        except ValueError:
            return False

    def _check_running(self) -> None:
        self._raise_unless_started(self._started)
        if not self.host_root.is_dir():
            raise RuntimeDied(f"session directory {self.host_root} has vanished")

    def wrap_argv(
        self, argv: Sequence[str], *, cwd: PurePosixPath, env: Mapping[str, str], timeout: float
    ) -> list[str]:
        """The host command line that runs ``argv`` in the sandbox (limits, tunnel and timeout inside)."""
        inner = list(argv)
        if self._spec.network is NetworkMode.PROXY:
            inner = wrap_command(sys.executable, str(self.root / _FORWARDER), port=self._spec.proxy_port,
                                 socket_path=_PROXY_SOCKET, argv=inner)  # fmt: skip
        spec = self._spec
        limits = prlimit_argv(data_bytes=parse_size(spec.memory_limit), nproc=spec.pids_limit,
                              cpu_s=spec.cpu_time_limit_s, fsize_bytes=parse_size(spec.file_size_limit))  # fmt: skip
        # gVisor does not count mmap in RLIMIT_DATA: bound each process's address space instead.
        limits.insert(1, f"--as={parse_size(spec.memory_limit)}")
        envs = [arg for key, value in env.items() for arg in ("--env", f"{key}={value}")]
        head = [*self._flags(), "exec", "--user", f"{self._uid}:{self._gid}", "--cwd", str(cwd), *envs, self._id]
        return [*head, *limits, sys.executable, _REAPER, f"{timeout:.3f}", *inner]

    async def exec(
        self,
        argv: Sequence[str],
        *,
        cwd: str | PurePosixPath | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float,  # noqa: ASYNC109 - enforced inside the sandbox, which kills the process group
    ) -> ExecResult:
        """Run a command in the sandbox; see :meth:`runtimes.base.Runtime.exec`."""
        self._check_running()
        if self._quota_breach is not None:
            raise DiskQuotaExceeded(self._quota_breach)
        host_cwd = self._dir.host_path(cwd) if cwd is not None else self.host_root
        inner_cwd = self.root / host_cwd.relative_to(self.host_root)
        pid_file = self._private / f"exec-{uuid.uuid4().hex}.pid"
        wrapped = self.wrap_argv(argv, cwd=inner_cwd, env=self.environment(env), timeout=timeout)
        wrapped.insert(wrapped.index("exec") + 1, f"--internal-pid-file={pid_file}")
        # Shielded: the guest command holds runsc exec's pipes, so killing runsc exec does not end the wait; a
        # cancelled exec first ends the command inside (SIGTERM to its reaper), then waits for it.
        work = asyncio.ensure_future(self._exec_wrapped(wrapped, timeout))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            with contextlib.suppress(OSError, ValueError):
                pid = int(pid_file.read_text())
                await self._runsc(["kill", "--pid", str(pid), self._id, "TERM"])
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(work, 30.0)
            raise
        finally:
            pid_file.unlink(missing_ok=True)

    async def _exec_wrapped(self, wrapped: list[str], timeout: float) -> ExecResult:  # noqa: ASYNC109
        started = time.monotonic()
        process = run_process(wrapped, cwd=None, env={"PATH": _DEFAULT_PATH}, timeout=timeout + _EXEC_GRACE_S)
        if self._spec.disk_limit is None:
            result = await process
        else:
            result, breach = await watch_quota(
                process, measure=self._disk_usage, limit=parse_size(self._spec.disk_limit), on_exceeded=self._over_quota
            )
            if breach is not None:
                raise DiskQuotaExceeded(self._quota_breach or "the sandbox used more than its disk quota")
        self._raise_if_cancelled(" while a command ran")
        if result.timed_out:
            await self._destroy()
            command = " ".join(wrapped[wrapped.index(_REAPER) + 2 :])[:120]
            raise RuntimeDied(f"runsc exec hung past its timeout in {self._session_id} ({command})")
        if result.exit_code == _RUNSC_FAILED and not await self._running():
            raise RuntimeDied(f"the gVisor sandbox of {self._session_id} stopped: {result.stderr.strip()[-300:]}")
        if not self.host_root.is_dir():
            raise RuntimeDied(f"session directory {self.host_root} vanished while a command ran")
        timed_out = result.exit_code == _TIMEOUT_EXIT_CODE and time.monotonic() - started >= timeout - 0.5
        return ExecResult(exit_code=result.exit_code, stdout=result.stdout, stderr=result.stderr, timed_out=timed_out,
                          duration_s=result.duration_s)  # fmt: skip

    async def _disk_usage(self) -> int:
        limit = parse_size(self._spec.disk_limit or 0)
        return await asyncio.to_thread(allocated_bytes, self.host_root, stop_above=limit)

    async def _over_quota(self, used: int) -> None:
        """The quota broke: remember why and kill every process of the sandbox (the sandbox with them)."""
        limit = parse_size(self._spec.disk_limit or 0)
        self._quota_breach = quota_message(used, limit, f"the sandbox of {self._session_id}")
        _log.warning("gvisor runtime: %s; its sandbox is killed", self._quota_breach)
        await self._runsc(["kill", "--all", self._id, "KILL"])

    async def upload(self, src: Path | bytes, dest: str | PurePosixPath, *, exclude: Sequence[str] = ()) -> None:
        """Copy a host file/directory or bytes below the session directory, owned by the sandbox user."""
        self._check_running()
        await self._dir.upload(src, dest, exclude)
        await asyncio.to_thread(self._own_tree, self._dir.host_path(dest))

    async def download(self, src: str | PurePosixPath) -> bytes:
        """Read a regular file below the session directory."""
        self._check_running()
        return await self._dir.download(src)


def _tmpfs(destination: str, size: str) -> dict[str, Any]:
    return {"destination": destination, "type": "tmpfs", "source": "tmpfs",
            "options": [f"size={parse_size(size)}", "mode=1777", "nosuid", "nodev"]}  # fmt: skip


def _bind(source: Path, destination: PurePosixPath | Path, *, read_only: bool) -> dict[str, Any]:
    return {"destination": str(destination), "type": "bind", "source": str(source),
            "options": ["rbind", "ro" if read_only else "rw"]}  # fmt: skip


def _mount_point(rootfs: Path, destination: str, *, directory: bool) -> None:
    """Create what ``destination`` is mounted on inside the read-only root (gVisor cannot create it there)."""
    target = rootfs / destination.lstrip("/")
    if target.exists() or target.is_symlink():
        return
    with contextlib.suppress(FileExistsError):
        if directory:
            target.mkdir(parents=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch()
