"""The local runtime: a per-session directory on the host, commands isolated with bubblewrap.

Isolation, strongest first (``isolation: auto`` picks the first that works on this machine):

* ``bwrap`` — ``bwrap --unshare-all --cap-drop ALL`` (and ``--disable-userns`` where bubblewrap has it): new
  user, pid, ipc, uts, cgroup and network namespaces (loopback only), no capabilities, a read-only view of the
  system directories and the Python in use, a private ``/etc`` holding only what programs need (generated
  ``passwd``/``group``/``hosts``/``hostname``), and the session directory as the only writable place besides a
  private ``/tmp``. Host files outside those (other sessions, the task's reference fix, credentials under
  ``/root``, the operator's ``/etc``) are not visible. Started as root, commands run as ``sandbox_uid`` inside,
  mapped to an unprivileged host id leased for the session (:mod:`runtimes._hostids`; bubblewrap itself runs as
  that id). A ``network: proxy`` session has one socket-activated forwarder (:mod:`runtimes._forwarder`), as root
  and as an ordinary user.
* ``unshare`` — ``unshare`` with new user, pid, ipc, uts, mount and network namespaces. The file system is
  the host's (not hidden); the network namespace has no interfaces up, so not even loopback works.
* ``none`` — a plain subprocess; for machines without namespaces.

``unshare`` and ``none`` log a WARNING for every session that uses them. The spec's ``min_isolation`` is a floor:
``auto`` never picks anything weaker, and a runtime that cannot reach it refuses to start with
:class:`runtimes.errors.IsolationUnavailable` (``FailedPrecondition``). :func:`probe_isolation` says once, with the
reason for each missing level, what this host provides (the gateway and the evaluator call it at start).

Every command runs under the resource limits of :mod:`runtimes._limits` (cgroups where they can be made here,
rlimits always) and the workspace disk quota: started as root, the session directory is a loop-mounted image of
the quota's size (:mod:`runtimes._diskimage`), otherwise the watchdog of :mod:`runtimes._quota` watches it;
the first session logs what this host cannot enforce. Every command gets a clean
environment: a fixed ``PATH`` plus what every runtime sets
(:meth:`runtimes._session.SessionRuntime.environment`: ``HOME=<session>/home``, ``TMPDIR=<session>/tmp``,
``LANG``, ``POLAR_SESSION_DIR``, the spec's and the caller's variables). Nothing from the host leaks in.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from runtimes import tunnel
from runtimes._diskimage import IMAGE_DIR_NAME, SessionDisk, sweep, unsupported
from runtimes._forwarder import SessionForwarder
from runtimes._hostdir import HostSessionDir
from runtimes._hostids import HostIdLease, HostIdRange, lease_host_id, sweep_leases
from runtimes._limits import LimitProbe, parse_size, prlimit_argv, probe_limits, remove_cgroups
from runtimes._process import run_process
from runtimes._quota import allocated_bytes, quota_message, watch_quota
from runtimes._session import SESSION_SUBDIRS, SessionRuntime
from runtimes.base import ExecResult
from runtimes.errors import DiskQuotaExceeded, IsolationUnavailable, RuntimeDied
from runtimes.spec import Isolation, NetworkMode, RuntimeSpec
from runtimes.tunnel import script_bytes, wrap_command

__all__ = ["HostIdRange", "IsolationProbe", "LocalHost", "LocalRuntime", "probe_isolation"]

_log = logging.getLogger(__name__)

_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt")
# What of the host's /etc a sandbox sees: what the C library, Python, node, git and TLS need, nothing of the
# operator's own configuration (users, shadow, hostname, gitconfig, npmrc, service configs).
_ETC_ALLOWED = ("ssl/certs", "ssl/openssl.cnf", "ca-certificates", "ca-certificates.conf", "alternatives",
                "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf", "host.conf", "gai.conf",
                "protocols", "services", "mime.types", "os-release", "terminfo", "python3", "python3.11",
                "python3.12", "python3.13")  # fmt: skip
_SANDBOX_HOSTNAME = "polar-sandbox"
_CGROUP_JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1/cgroup.procs" || exit 126; shift; done; shift; exec "$@"'
_FORWARDER = ".polar/tunnel.py"
_UNSHARE_FLAGS = ("unshare", "--user", "--map-root-user", "--pid", "--ipc", "--uts", "--mount", "--fork",
                  "--kill-child", "--mount-proc")  # fmt: skip
# Where the proxy's socket appears inside the sandbox: a short fixed path, because a Unix socket path is limited
# to 108 bytes and session directories (which keep their host path) can be longer than that.
_PROXY_SOCKET = "/run/polar/proxy.sock"


def _is_root() -> bool:
    return os.geteuid() == 0


def _as_user(uid: int) -> list[str]:
    """The prefix that runs the rest of a command line as host uid and gid ``uid``, in no supplementary group."""
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]


def _probe_user(ids: HostIdRange | None = None) -> list[str]:
    """Probes run as root's sandboxes do: as an id of the sandbox range (see :mod:`runtimes._hostids`)."""
    return _as_user((ids or HostIdRange()).base) if _is_root() else []


async def _probe(argv: Sequence[str]) -> bool:
    try:
        result = await run_process(argv, cwd=Path("/"), env={"PATH": _DEFAULT_PATH}, timeout=10.0)
    except OSError:
        return False
    return result.ok


def _system_binds() -> list[str]:
    """bubblewrap arguments showing the host's system directories read-only (a symlink stays a symlink)."""
    args: list[str] = []
    for name in _SYSTEM_DIRS:
        path = Path(name)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), name]
        elif path.exists():
            args += ["--ro-bind", name, name]
    return args


# The system directories, as sessions see them, not the whole of /: a recursive read-only bind of / remounts
# every mount below it, and one that comes or goes meanwhile (a container starting on this host) fails the probe.
_BWRAP_PROBE = ["bwrap", "--unshare-all", "--unshare-user", "--cap-drop", "ALL", *_system_binds(), "--proc",
                "/proc", "--dev", "/dev"]  # fmt: skip


class LocalHost:
    """What the local runtimes of one factory learn about this host once and share.

    bubblewrap's optional flags are probed on first use, not per session, and what the resource limits cannot
    enforce here is logged by the first session only. A :class:`runtimes.factory.DefaultRuntimeFactory` owns one
    and hands it to every :class:`LocalRuntime` it builds; a runtime built without one gets its own.
    """

    def __init__(self, host_ids: HostIdRange | None = None) -> None:
        self.host_ids = host_ids or HostIdRange()
        self._disable_userns: bool | None = None
        self._tmpfs_size: bool | None = None
        self._limits_logged = False
        self._no_disk_images: str | None = None
        self._disk_probed = False
        # Set when an ordinary user could not start a session's forwarder (no user namespace of its own): later
        # sessions go straight to a forwarder per command.
        self.rootless_forwarder_failed = False

    async def bwrap_disables_userns(self) -> bool:
        """Whether this bubblewrap can disable user namespaces inside the sandbox (``--disable-userns``, 0.8+)."""
        if self._disable_userns is None:
            as_user = _probe_user(self.host_ids)
            self._disable_userns = await _probe([*as_user, *_BWRAP_PROBE, "--disable-userns", "true"])
            if not self._disable_userns:
                _log.warning("bubblewrap cannot disable user namespaces here (needs 0.8+): sandboxes may create them")
        return self._disable_userns

    async def bwrap_sizes_tmpfs(self) -> bool:
        """Whether this bubblewrap can bound a tmpfs (``--size``, 0.8+); without it ``/tmp`` is bounded by memory."""
        if self._tmpfs_size is None:
            self._tmpfs_size = await _probe([*_probe_user(self.host_ids), *_BWRAP_PROBE, "--size", "1048576", "--tmpfs",
                                             "/tmp", "true"])  # fmt: skip
        return self._tmpfs_size

    @property
    def disk_images(self) -> bool:
        """Whether sessions get a loop-mounted image of their quota's size (:mod:`runtimes._diskimage`)."""
        if not self._disk_probed:
            self._disk_probed = True
            self._no_disk_images = unsupported()
        return self._no_disk_images is None

    def log_limits_once(self, probe: LimitProbe) -> None:
        """Log, the first time only, which resource limits this host cannot enforce."""
        if not self._limits_logged:
            self._limits_logged = True
            for missing in probe.not_enforced():
                _log.warning("local runtime: not enforced on this host: %s", missing)
            if not self.disk_images:
                _log.warning("local runtime: not enforced on this host: a hard disk quota (%s; a watchdog kills a "
                             "sandbox over its quota after the fact)", self._no_disk_images)  # fmt: skip


async def _probe_failure(tool: str, argv: Sequence[str], what: str) -> str | None:
    """``None`` when ``argv`` runs; else why not (the tool missing, or its exit status and stderr)."""
    if shutil.which(tool) is None:
        return f"{tool} is not installed"
    try:
        result = await run_process([*_probe_user(), *argv], cwd=Path("/"), env={"PATH": _DEFAULT_PATH}, timeout=10.0)
    except OSError as exc:
        return f"{tool} cannot be started: {exc}"
    if result.ok:
        return None
    detail = (result.stderr or result.stdout).strip()[-300:] or f"exit status {result.exit_code}"
    return f"{tool} cannot {what}: {detail}"


@dataclasses.dataclass(frozen=True, slots=True)
class IsolationProbe:
    """What this host's local runtime can provide.

    Attributes:
        best: The strongest isolation that works here.
        missing: Why each stronger level does not work (``"bubblewrap is not installed"``, ...).
    """

    best: Isolation
    missing: Mapping[Isolation, str] = dataclasses.field(default_factory=dict)

    def shortfall(self, minimum: Isolation) -> str | None:
        """``None`` when ``minimum`` is available here; else what is missing, in one line."""
        if self.best.rank >= minimum.rank:
            return None
        reason = self.missing.get(minimum) or f"{minimum.value} isolation is not available on this host"
        return f"the operator's minimum isolation {minimum.value!r} is not available here: {reason}"


async def probe_isolation(minimum: Isolation = Isolation.NONE) -> IsolationProbe:
    """Probe, with the flags the runtime runs with, which isolation this host provides (``true`` as command).

    Inside a container whose /proc is masked (Docker's default), creating namespaces works but mounting a fresh
    /proc does not, and both tools need that: the probes find that out. gVisor is probed (and chosen) only when
    ``minimum`` asks for it (:mod:`runtimes.gvisor`); ``auto`` otherwise stays with the namespace levels.
    """
    missing: dict[Isolation, str] = {}
    if minimum is Isolation.GVISOR:
        from runtimes.gvisor import probe_gvisor

        gvisor = await probe_gvisor()
        if gvisor is None:
            return IsolationProbe(Isolation.GVISOR)
        missing[Isolation.GVISOR] = gvisor
    bwrap = await _probe_failure("bwrap", [*_BWRAP_PROBE, "true"], "create its sandbox")
    if bwrap is None:
        return IsolationProbe(Isolation.BWRAP)
    missing[Isolation.BWRAP] = bwrap.replace("bwrap is not installed", "bubblewrap (bwrap) is not installed")
    unshare = await _probe_failure("unshare", [*_UNSHARE_FLAGS, "--net", "--", "true"], "create namespaces")
    if unshare is None:
        return IsolationProbe(Isolation.UNSHARE, missing)
    missing[Isolation.UNSHARE] = unshare
    return IsolationProbe(Isolation.NONE, missing)


class LocalRuntime(SessionRuntime):
    """A session directory under ``base_dir`` with commands run in a bubblewrap (or weaker) sandbox.

    Args:
        spec: The runtime spec (``kind`` local).
        session_id: Names the session directory (``base_dir/session_id``).
        base_dir: Parent of session directories.
        host: What is known about this host, shared with the other runtimes of the same factory (``None``: this
            runtime probes for itself).
    """

    def __init__(self, spec: RuntimeSpec, *, session_id: str, base_dir: Path, host: LocalHost | None = None) -> None:
        super().__init__(spec, session_id=session_id)
        self._host = host or LocalHost()
        host_root = (base_dir / session_id).absolute()
        # Until start() chooses bubblewrap, and under the weaker isolations (no mount namespace of their own), the
        # session directory is seen at its host path.
        self._dir = HostSessionDir(host_root, PurePosixPath(host_root))
        self._isolation: Isolation | None = None
        self._started = False
        self._live_groups: set[int] = set()
        self._limits = probe_limits()
        self._cgroups: list[Path] = []
        self._disable_userns = False
        self._tmpfs_size = False
        self._quota_breach: str | None = None
        self._lease: HostIdLease | None = None
        self._disk: SessionDisk | None = None
        # Host paths bubblewrap binds, as the leased host id reaches them (see runtimes._hostids).
        self._reach: dict[Path, Path] = {}
        self._forwarder: SessionForwarder | None = None

    @property
    def root(self) -> PurePosixPath:
        """The session directory as commands see it: ``container_root`` under bubblewrap, else its host path.

        Under bubblewrap every session sees the same path, so an agent's prompts (which name its working
        directory) are the same from session to session: a backend's prefix cache is shared across sessions, and
        no host path reaches a trace.
        """
        return self._dir.inner_root

    @property
    def host_root(self) -> Path:
        """The session directory on the host."""
        return self._dir.host_root

    @property
    def isolation(self) -> Isolation | None:
        """The isolation in use once started."""
        return self._isolation

    async def start(self) -> None:
        """Create the session directory (its own file system where possible) and choose the isolation.

        Raises:
            IsolationUnavailable: The spec's isolation (or its minimum) is not available here.
            DiskSpaceUnavailable: The disk quota is larger than the host's free space.
            DiskSpaceHeld: It fits the free space, not next to what running sessions' quotas may still take.
        """
        self._raise_if_cancelled()
        if self._started:
            return
        try:
            await self._start()
        except BaseException:
            await self._release()
            raise

    async def _make_session_dir(self, isolation: Isolation) -> None:
        """The session directory: a loop-mounted image of ``disk_limit`` (root), owned by the sandbox's host id.

        Only bubblewrap sandboxes run as a leased host id on their own image: bubblewrap binds the image at the
        sandbox's path and lets that id reach what it needs. Without bubblewrap (``unshare``, ``none``: the operator
        allows the host's file system) commands run as the runtime's own user in a plain directory under the
        quota's watchdog, as before: a leased id could not reach the root-only directories they use, and the link
        to an image would show in every path they compute.
        """
        root = self.host_root
        if _is_root() and isolation is Isolation.BWRAP:
            self._lease = await asyncio.to_thread(lease_host_id, self._host.host_ids)
        owner = (self._lease.uid, self._lease.uid) if self._lease is not None else (os.getuid(), os.getgid())
        if _is_root():
            # What crashed owners left on this host: staged binds first (they keep images busy), then images.
            await asyncio.to_thread(sweep_leases, self._host.host_ids)
            if self._host.disk_images:
                await asyncio.to_thread(sweep)
        if self._spec.disk_limit is not None and isolation is Isolation.BWRAP and self._host.disk_images:
            images = root.parent / IMAGE_DIR_NAME
            self._disk = await asyncio.to_thread(
                SessionDisk.create, images, root.name, parse_size(self._spec.disk_limit), owner=owner
            )
            # The session directory is a link to the image's mount, which lives outside base_dir (a mount left by a
            # crash never blocks deleting base_dir; the next start sweeps it).
            root.parent.mkdir(parents=True, exist_ok=True)
            root.symlink_to(self._disk.mountpoint, target_is_directory=True)
        for sub in SESSION_SUBDIRS:
            (root / sub).mkdir(parents=True, exist_ok=True)
        if self._lease is not None:
            for path in (root, *(root / sub for sub in SESSION_SUBDIRS)):
                os.lchown(path, *owner)

    async def _start(self) -> None:
        isolation = self._spec.isolation
        minimum = self._spec.min_isolation
        if isolation is Isolation.AUTO:
            probe = await probe_isolation(minimum)
            shortfall = probe.shortfall(minimum)
            if shortfall is not None:
                raise IsolationUnavailable(shortfall)
            isolation = probe.best
        if isolation.rank < minimum.rank:
            raise IsolationUnavailable(f"isolation {isolation.value!r} is weaker than the minimum {minimum.value!r}")
        if isolation is Isolation.GVISOR:  # fail closed: create_runtime builds runtimes.gvisor.GVisorRuntime for it
            raise IsolationUnavailable("isolation 'gvisor' is run by runtimes.gvisor.GVisorRuntime, not LocalRuntime")
        await self._make_session_dir(isolation)
        root = self.host_root
        if isolation is Isolation.NONE:
            _log.warning("local runtime %s runs commands WITHOUT ISOLATION (the operator allows it)", self._session_id)
        elif isolation is Isolation.UNSHARE:
            _log.warning("local runtime %s runs commands with weak isolation 'unshare': the host file system is "
                         "visible (the operator allows it)", self._session_id)  # fmt: skip
        self._isolation = isolation
        owner = None if self._lease is None else (self._lease.uid, self._lease.uid)
        self._dir = HostSessionDir(root, self._dir.inner_root, owner)
        if isolation is Isolation.BWRAP:
            self._dir = HostSessionDir(root, PurePosixPath(self._spec.container_root), owner)
            self._disable_userns = await self._host.bwrap_disables_userns()
            self._tmpfs_size = await self._host.bwrap_sizes_tmpfs()
            _write_etc(root / ".polar" / "etc", self._spec.sandbox_uid if _is_root() else os.getuid(),
                       self._spec.sandbox_gid if _is_root() else os.getgid())  # fmt: skip
        self._host.log_limits_once(self._limits)
        try:
            self._cgroups = await asyncio.to_thread(
                self._limits.cgroups.create,
                self._session_id,
                pids_max=self._spec.pids_limit,
                memory_max=parse_size(self._spec.memory_limit),
            )
        except OSError as exc:
            _log.warning("local runtime %s: no cgroup (%s); only rlimits apply", self._session_id, exc)
        if self._lease is not None and isolation is Isolation.BWRAP:
            self._reach = await asyncio.to_thread(self._reachable_binds)
        if self._spec.network is NetworkMode.PROXY:
            await self._open_tunnel()
        self._started = True

    async def _open_tunnel(self) -> None:
        """The session's one forwarder where it can have one; else each command starts its own (runtimes.tunnel)."""
        if self._session_forwarder_wanted():
            self._forwarder = await self._start_forwarder()
        if self._forwarder is None:
            (self.host_root / _FORWARDER).write_bytes(script_bytes())

    def _session_forwarder_wanted(self) -> bool:
        """One forwarder per session (:mod:`runtimes._forwarder`): bubblewrap sandboxes on ``proxy``."""
        return (self._isolation is Isolation.BWRAP and self._spec.network is NetworkMode.PROXY
                and self._spec.proxy_socket is not None and not self._host.rootless_forwarder_failed)  # fmt: skip

    async def _start_forwarder(self) -> SessionForwarder | None:
        """The session's forwarder; ``None`` where an ordinary user cannot make a user namespace to own it."""
        assert self._spec.proxy_socket is not None
        socket_path = self._reach.get(self._spec.proxy_socket) or (
            self._reached(self._spec.proxy_socket.parent) / self._spec.proxy_socket.name
        )
        # Our own copy, which no sandbox can write: the forwarder runs outside the sandbox's mount namespace.
        script = Path(tunnel.__file__)
        uid = self._lease.uid if self._lease is not None else None
        try:
            return await SessionForwarder.start(self._limit_prefix(), python=sys.executable, script=script,
                                                port=self._spec.proxy_port, socket_path=socket_path,
                                                uid=uid, staged=self._reach)  # fmt: skip
        except RuntimeDied as exc:
            if uid is not None:
                raise
            # E.g. a setuid bubblewrap on a host without unprivileged user namespaces: every command then starts
            # its own forwarder inside its sandbox, as before.
            _log.warning("local runtime: no per-session proxy forwarder as an ordinary user (%s); each command "
                         "starts its own", exc)  # fmt: skip
            self._host.rootless_forwarder_failed = True
            return None

    def _reachable_binds(self) -> dict[Path, Path]:
        """Stage, for the leased host id, every host path bubblewrap binds that it could not reach (blocking)."""
        lease = self._lease
        assert lease is not None
        # The session directory itself: a link to its image's mount where it has one, bound as what it links to.
        reach = {self.host_root: lease.reachable(Path(os.path.realpath(self.host_root)), writable=True)}
        for path in self._read_only_paths():
            reach[path] = lease.reachable(path)
        socket_path = self._spec.proxy_socket
        if self._spec.network is NetworkMode.PROXY and socket_path is not None:
            # The socket's directory when others may pass through it (a re-created socket stays reachable) or the
            # socket is not there yet, else the socket itself.
            if socket_path.parent.stat().st_mode & 0o001 or not socket_path.exists():
                reach[socket_path.parent] = lease.reachable(socket_path.parent, writable=True)
            else:
                reach[socket_path] = lease.reachable(socket_path, writable=True)
        return reach

    def _reached(self, path: Path) -> Path:
        return self._reach.get(path, path)

    async def stop(self) -> None:
        """Kill running commands, unmount and delete the session directory. Idempotent."""
        self._started = False
        self._kill_all()
        await self._release()

    async def _release(self) -> None:
        """Give back what start() took: the forwarder, staged binds, the disk image, the directory, cgroups, the id."""
        forwarder, self._forwarder = self._forwarder, None
        if forwarder is not None:
            await forwarder.stop()
        lease, self._lease = self._lease, None
        if lease is not None:
            await asyncio.to_thread(lease.release)  # unmounts staged binds before the image below them
        self._reach = {}
        disk, self._disk = self._disk, None
        if disk is not None:
            await asyncio.to_thread(disk.remove)
        await asyncio.to_thread(_remove_session_dir, self.host_root)
        cgroups, self._cgroups = self._cgroups, []
        await asyncio.to_thread(remove_cgroups, cgroups)

    def _kill_all(self) -> None:
        for pgid in list(self._live_groups):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)

    def _check_running(self) -> None:
        self._raise_unless_started(self._started)
        if not self.host_root.is_dir() or (self._disk is not None and not os.path.ismount(self._disk.mountpoint)):
            raise RuntimeDied(f"session directory {self.host_root} has vanished")

    def _own_variables(self) -> dict[str, str]:
        return {"PATH": _DEFAULT_PATH, **super()._own_variables()}

    def wrap_argv(self, argv: Sequence[str], *, cwd: PurePosixPath, env: Mapping[str, str]) -> list[str]:
        """The host command line that runs ``argv`` under the chosen isolation."""
        inner = list(argv)
        per_command = self._forwarder is None and self._isolation is not Isolation.NONE
        if self._spec.network is NetworkMode.PROXY and per_command:
            inner = wrap_command(
                sys.executable,
                str(self.root / _FORWARDER),
                port=self._spec.proxy_port,
                socket_path=_PROXY_SOCKET,
                argv=inner,
            )
        if self._isolation is Isolation.BWRAP:
            sandboxed = [*self._bwrap_prefix(cwd, env), "--", *inner]
        elif self._isolation is Isolation.UNSHARE:
            net = [] if self._spec.network is NetworkMode.HOST else ["--net"]
            sandboxed = [*_UNSHARE_FLAGS, *net, "--", *inner]
        else:
            sandboxed = inner
        # Started as root, the sandbox runs as its leased unprivileged host id, bubblewrap included.
        drop = _as_user(self._lease.uid) if self._lease is not None else []
        # In the session's network namespace, where its one forwarder listens (runtimes._forwarder).
        net = self._forwarder.enter_argv() if self._forwarder is not None else []
        return [*self._limit_prefix(), *net, *drop, *sandboxed]

    def _limit_prefix(self) -> list[str]:
        """Join the session's cgroups, then apply the per-process rlimits, then run the sandbox."""
        prefix: list[str] = []
        if self._cgroups:
            prefix = ["sh", "-c", _CGROUP_JOIN, "polar-cgroup", *map(str, self._cgroups), "--"]
        if self._limits.prlimit:
            spec = self._spec
            prefix += prlimit_argv(
                data_bytes=parse_size(spec.memory_limit),
                nproc=spec.pids_limit,
                cpu_s=spec.cpu_time_limit_s,
                fsize_bytes=parse_size(spec.file_size_limit),
            )
        return prefix

    def _read_only_paths(self) -> list[Path]:
        paths = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent.parent]
        paths.extend(self._spec.read_only_paths)
        seen: list[Path] = []
        for path in paths:
            if path.exists() and path not in seen:
                seen.append(path)
        return seen

    def _bwrap_prefix(self, cwd: PurePosixPath, env: Mapping[str, str]) -> list[str]:
        args = ["bwrap", "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
                "--hostname", _SANDBOX_HOSTNAME]  # fmt: skip
        if self._lease is not None:
            # bubblewrap runs as the leased host id and maps sandbox_uid to it (never to host uid 0).
            args += ["--uid", str(self._spec.sandbox_uid), "--gid", str(self._spec.sandbox_gid)]
        elif self._forwarder is not None and self._forwarder.rootless:
            # In the forwarder's user namespace this user is its root: keep the sandbox's ids the host user's own.
            args += ["--uid", str(os.getuid()), "--gid", str(os.getgid())]
        if self._disable_userns:
            args.append("--disable-userns")
        if self._spec.network is NetworkMode.HOST or self._forwarder is not None:
            args.append("--share-net")  # the host's network, or the session's own namespace (nsenter)
        args += _system_binds()
        args += self._etc_args()
        # The private /tmp comes before the read-only binds: bwrap mounts in order, so an interpreter or a
        # checkout that itself lives under the host's /tmp stays visible on top of it.
        # /tmp and /dev/shm are memory: each bounded by tmp_size where bubblewrap can size a tmpfs (0.8+), and
        # /dev itself read-only (its tmpfs would be unbounded).
        args += ["--proc", "/proc", "--dev", "/dev"]
        if self._tmpfs_size:
            size = str(parse_size(self._spec.tmp_size))
            args += ["--size", size, "--tmpfs", "/dev/shm", "--remount-ro", "/dev", "--size", size, "--tmpfs", "/tmp"]
        else:
            args += ["--tmpfs", "/tmp"]
        for path in self._read_only_paths():
            args += ["--ro-bind", str(self._reached(path)), str(path)]
        args += ["--bind", str(self._reached(self.host_root)), str(self.root)]
        if self._spec.network is NetworkMode.PROXY and self._spec.proxy_socket is not None:
            socket_path = self._reach.get(self._spec.proxy_socket) or (
                self._reached(self._spec.proxy_socket.parent) / self._spec.proxy_socket.name
            )
            args += ["--bind", str(socket_path), _PROXY_SOCKET]
        args += ["--chdir", str(cwd), "--clearenv"]
        for key, value in env.items():
            args += ["--setenv", key, value]
        return args

    def _etc_args(self) -> list[str]:
        """A private ``/etc``: generated ``passwd``/``group``/``hosts``/``hostname`` plus :data:`_ETC_ALLOWED`."""
        args = ["--dir", "/etc"]
        for rel in _ETC_ALLOWED:
            path = Path("/etc") / rel
            if path.exists():
                args += ["--ro-bind", str(path), str(path)]
        if self._spec.network is NetworkMode.HOST and Path("/etc/resolv.conf").exists():
            args += ["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"]
        generated = self._reached(self.host_root) / ".polar" / "etc"
        for name in _GENERATED_ETC:
            args += ["--ro-bind", str(generated / name), f"/etc/{name}"]
        return args

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
        if self._forwarder is not None and not self._forwarder.alive:
            _log.warning("local runtime %s: the proxy forwarder ended; starting another", self._session_id)
            await self._forwarder.stop()
            self._forwarder = None
            await self._open_tunnel()
        host_cwd = self._dir.host_path(cwd) if cwd is not None else self.host_root
        inner_cwd = self.root / host_cwd.relative_to(self.host_root)
        full_env = self.environment(env)
        wrapped = self.wrap_argv(argv, cwd=inner_cwd, env=full_env)
        # bwrap sets the environment and the directory itself (--clearenv/--setenv, --chdir); the other modes
        # pass them directly.
        bwrap = self._isolation is Isolation.BWRAP
        host_env = {"PATH": _DEFAULT_PATH} if bwrap else full_env
        if self._quota_breach is not None:
            raise DiskQuotaExceeded(self._quota_breach)
        process = run_process(
            wrapped,
            cwd=Path("/") if bwrap else host_cwd,
            env=host_env,
            timeout=timeout,
            on_start=self._live_groups.add,
            on_end=self._live_groups.discard,
        )
        if self._disk is not None:
            # An image of the quota's size refuses the write past it (ENOSPC). A sandbox that filled it has reached
            # its quota: the session ends as before (DiskQuotaExceeded), with nothing written past the quota.
            result = await process
            disk = self._disk  # None once the runtime was stopped while the command ran
            if disk is not None and await asyncio.to_thread(disk.full):
                self._quota_breach = disk.quota_message(f"the sandbox of {self._session_id}")
                _log.warning("local runtime: %s", self._quota_breach)
                raise DiskQuotaExceeded(self._quota_breach)
        elif self._spec.disk_limit is None:
            result = await process
        else:
            result, breach = await watch_quota(
                process, measure=self._disk_usage, limit=parse_size(self._spec.disk_limit), on_exceeded=self._over_quota
            )
            if breach is not None:
                raise DiskQuotaExceeded(self._quota_breach or "the sandbox used more than its disk quota")
        self._raise_if_cancelled(" while a command ran")
        if not self.host_root.is_dir():
            raise RuntimeDied(f"session directory {self.host_root} vanished while a command ran")
        return result

    async def _disk_usage(self) -> int:
        limit = parse_size(self._spec.disk_limit or 0)
        return await asyncio.to_thread(allocated_bytes, self.host_root, stop_above=limit)

    async def _over_quota(self, used: int) -> None:
        """The quota broke: remember why and kill every command of the sandbox."""
        limit = parse_size(self._spec.disk_limit or 0)
        self._quota_breach = quota_message(used, limit, f"the sandbox of {self._session_id}")
        _log.warning("local runtime: %s; its processes are killed", self._quota_breach)
        self._kill_all()

    async def upload(self, src: Path | bytes, dest: str | PurePosixPath, *, exclude: Sequence[str] = ()) -> None:
        """Copy a host file/directory or bytes below the session directory."""
        self._check_running()
        await self._dir.upload(src, dest, exclude)

    async def download(self, src: str | PurePosixPath) -> bytes:
        """Read a regular file below the session directory."""
        self._check_running()
        return await self._dir.download(src)


_GENERATED_ETC = ("passwd", "group", "hosts", "hostname")


def _remove_session_dir(path: Path) -> None:
    """Delete a session directory, or the link to its image's (already unmounted) mount."""
    if path.is_symlink():
        path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


def _write_etc(directory: Path, uid: int, gid: int) -> None:
    """Write the sandbox's own ``passwd``, ``group``, ``hosts`` and ``hostname`` (nothing of the host's)."""
    directory.mkdir(parents=True, exist_ok=True)
    # Readable by the sandbox's leased host id whatever the umask (a Slurm job may run under 077).
    os.chmod(directory, 0o755)
    users = {0: ("root", 0), 65534: ("nobody", 65534)}
    users.setdefault(uid, ("sandbox", gid))
    groups = {0: "root", 65534: "nogroup"}
    groups.setdefault(gid, "sandbox")
    passwd = "".join(f"{name}:x:{u}:{g}::/nonexistent:/bin/sh\n" for u, (name, g) in users.items())
    group = "".join(f"{name}:x:{g}:\n" for g, name in groups.items())
    contents = {
        "passwd": passwd,
        "group": group,
        "hosts": f"127.0.0.1 localhost {_SANDBOX_HOSTNAME}\n::1 localhost\n",
        "hostname": f"{_SANDBOX_HOSTNAME}\n",
    }
    for name, text in contents.items():
        (directory / name).write_text(text)
        os.chmod(directory / name, 0o644)
