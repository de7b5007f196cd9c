"""The local runtime: a per-session directory on the host, commands isolated with bubblewrap.

Isolation, strongest first (``isolation: auto`` picks the first that works on this machine):

* ``bwrap`` — ``bwrap --unshare-all``: new user, pid, ipc, uts, cgroup and network namespaces (loopback
  only), a read-only view of the system directories and the Python in use, and the session directory as
  the only writable place besides a private ``/tmp``. Host files outside those (other sessions, the task's
  reference fix, credentials under ``/root``) are not visible.
* ``unshare`` — ``unshare`` with new user, pid, ipc, uts, mount and network namespaces. The file system is
  the host's (not hidden); the network namespace has no interfaces up, so not even loopback works.
* ``none`` — a plain subprocess (a warning is logged); for machines without namespaces.

Every command gets a clean environment: a fixed ``PATH`` plus what every runtime sets
(:meth:`runtimes._session.SessionRuntime.environment`: ``HOME=<session>/home``, ``TMPDIR=<session>/tmp``,
``LANG``, ``POLAR_SESSION_DIR``, the spec's and the caller's variables). Nothing from the host leaks in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from runtimes._hostdir import HostSessionDir
from runtimes._process import run_process
from runtimes._session import SESSION_SUBDIRS, SessionRuntime
from runtimes.base import ExecResult
from runtimes.errors import RuntimeDied
from runtimes.spec import Isolation, NetworkMode, RuntimeSpec
from runtimes.tunnel import script_bytes, wrap_command

__all__ = ["LocalRuntime", "detect_isolation"]

_log = logging.getLogger(__name__)

_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
_FORWARDER = ".polar/tunnel.py"
_UNSHARE_FLAGS = ("unshare", "--user", "--map-root-user", "--pid", "--ipc", "--uts", "--mount", "--fork",
                  "--kill-child", "--mount-proc")  # fmt: skip
# Where the proxy's socket appears inside the sandbox: a short fixed path, because a Unix socket path is limited
# to 108 bytes and session directories (which keep their host path) can be longer than that.
_PROXY_SOCKET = "/run/polar/proxy.sock"


async def _probe(argv: Sequence[str]) -> bool:
    try:
        result = await run_process(argv, cwd=None, env={"PATH": _DEFAULT_PATH}, timeout=10.0)
    except OSError:
        return False
    return result.ok


async def detect_isolation() -> Isolation:
    """Return the strongest isolation that works on this machine (probing with ``true``)."""
    if shutil.which("bwrap") and await _probe(
        ["bwrap", "--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"]
    ):
        return Isolation.BWRAP
    # The probes use the flags the runtime runs with: inside a container whose /proc is masked (Docker's
    # default), creating namespaces works but mounting a fresh /proc does not, and both tools need that.
    if shutil.which("unshare") and await _probe([*_UNSHARE_FLAGS, "--net", "--", "true"]):
        return Isolation.UNSHARE
    return Isolation.NONE


class LocalRuntime(SessionRuntime):
    """A session directory under ``base_dir`` with commands run in a bubblewrap (or weaker) sandbox.

    Args:
        spec: The runtime spec (``kind`` local).
        session_id: Names the session directory (``base_dir/session_id``).
        base_dir: Parent of session directories.
    """

    def __init__(self, spec: RuntimeSpec, *, session_id: str, base_dir: Path) -> None:
        super().__init__(spec, session_id=session_id)
        host_root = (base_dir / session_id).absolute()
        # Inside bwrap the session directory keeps its host path, so paths in logs mean the same everywhere.
        self._dir = HostSessionDir(host_root, PurePosixPath(host_root))
        self._isolation: Isolation | None = None
        self._started = False
        self._live_groups: set[int] = set()

    @property
    def root(self) -> PurePosixPath:
        """The session directory (the same path inside and outside the sandbox)."""
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
        """Create the session directory and choose the isolation."""
        self._raise_if_cancelled()
        if self._started:
            return
        root = self.host_root
        for sub in SESSION_SUBDIRS:
            (root / sub).mkdir(parents=True, exist_ok=True)
        isolation = self._spec.isolation
        if isolation is Isolation.AUTO:
            isolation = await detect_isolation()
        if isolation is Isolation.NONE:
            _log.warning("local runtime %s runs commands without isolation", self._session_id)
        self._isolation = isolation
        if self._spec.network is NetworkMode.PROXY:
            (root / _FORWARDER).write_bytes(script_bytes())
        self._started = True

    async def stop(self) -> None:
        """Kill running commands and delete the session directory. Idempotent."""
        self._started = False
        self._kill_all()
        await asyncio.to_thread(shutil.rmtree, self.host_root, True)

    def _kill_all(self) -> None:
        for pgid in list(self._live_groups):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)

    def _check_running(self) -> None:
        self._raise_unless_started(self._started)
        if not self.host_root.is_dir():
            raise RuntimeDied(f"session directory {self.host_root} has vanished")

    def _own_variables(self) -> dict[str, str]:
        return {"PATH": _DEFAULT_PATH, **super()._own_variables()}

    def wrap_argv(self, argv: Sequence[str], *, cwd: PurePosixPath, env: Mapping[str, str]) -> list[str]:
        """The host command line that runs ``argv`` under the chosen isolation."""
        inner = list(argv)
        if self._spec.network is NetworkMode.PROXY and self._isolation is not Isolation.NONE:
            inner = wrap_command(
                sys.executable,
                str(self.root / _FORWARDER),
                port=self._spec.proxy_port,
                socket_path=_PROXY_SOCKET,
                argv=inner,
            )
        if self._isolation is Isolation.BWRAP:
            return [*self._bwrap_prefix(cwd, env), "--", *inner]
        if self._isolation is Isolation.UNSHARE:
            net = [] if self._spec.network is NetworkMode.HOST else ["--net"]
            return [*_UNSHARE_FLAGS, *net, "--", *inner]
        return inner

    def _read_only_paths(self) -> list[Path]:
        paths = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent.parent]
        paths.extend(self._spec.read_only_paths)
        seen: list[Path] = []
        for path in paths:
            if path.exists() and path not in seen:
                seen.append(path)
        return seen

    def _bwrap_prefix(self, cwd: PurePosixPath, env: Mapping[str, str]) -> list[str]:
        args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session"]
        if self._spec.network is NetworkMode.HOST:
            args.append("--share-net")
        for name in _SYSTEM_DIRS:
            path = Path(name)
            if path.is_symlink():
                args += ["--symlink", os.readlink(path), name]
            elif path.exists():
                args += ["--ro-bind", name, name]
        # The private /tmp comes before the read-only binds: bwrap mounts in order, so an interpreter or a
        # checkout that itself lives under the host's /tmp stays visible on top of it.
        args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
        for path in self._read_only_paths():
            args += ["--ro-bind", str(path), str(path)]
        args += ["--bind", str(self.host_root), str(self.root)]
        if self._spec.network is NetworkMode.PROXY and self._spec.proxy_socket is not None:
            args += ["--bind", str(self._spec.proxy_socket), _PROXY_SOCKET]
        args += ["--chdir", str(cwd), "--clearenv"]
        for key, value in env.items():
            args += ["--setenv", key, value]
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
        inner_cwd = self._dir.host_path(cwd) if cwd is not None else self.host_root
        full_env = self.environment(env)
        wrapped = self.wrap_argv(argv, cwd=PurePosixPath(inner_cwd), env=full_env)
        # bwrap sets the environment itself (--clearenv/--setenv); the other modes pass it directly.
        host_env = {"PATH": _DEFAULT_PATH} if self._isolation is Isolation.BWRAP else full_env
        host_cwd = None if self._isolation is Isolation.BWRAP else inner_cwd
        result = await run_process(
            wrapped,
            cwd=host_cwd,
            env=host_env,
            timeout=timeout,
            on_start=self._live_groups.add,
            on_end=self._live_groups.discard,
        )
        self._raise_if_cancelled(" while a command ran")
        if not self.host_root.is_dir():
            raise RuntimeDied(f"session directory {self.host_root} vanished while a command ran")
        return result

    async def upload(self, src: Path | bytes, dest: str | PurePosixPath, *, exclude: Sequence[str] = ()) -> None:
        """Copy a host file/directory or bytes below the session directory."""
        self._check_running()
        await self._dir.upload(src, dest, exclude)

    async def download(self, src: str | PurePosixPath) -> bytes:
        """Read a regular file below the session directory."""
        self._check_running()
        return await self._dir.download(src)
