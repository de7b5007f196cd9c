"""The Apptainer runtime: commands run with ``apptainer exec`` against an image, session directory bound in.

UNVERIFIED: Apptainer is not installable on the project's machines, so only the command lines this module
builds are unit-tested; nothing here has run against a real ``apptainer`` binary. The session directory
lives on the host (like the local runtime) and is bound to ``container_root`` inside the container.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from runtimes._hostdir import HostSessionDir
from runtimes._process import run_process
from runtimes._session import SESSION_SUBDIRS, SessionRuntime
from runtimes.base import ExecResult
from runtimes.errors import RuntimeDied
from runtimes.spec import NetworkMode, RuntimeSpec

__all__ = ["ApptainerRuntime", "build_exec_argv"]


def build_exec_argv(
    spec: RuntimeSpec,
    *,
    host_root: Path,
    argv: Sequence[str],
    cwd: PurePosixPath,
    env: Mapping[str, str],
    binary: str = "apptainer",
) -> list[str]:
    """Build the ``apptainer exec`` command line that runs ``argv`` in ``spec.image``.

    ``--containall`` gives private PID, IPC and file-system namespaces and no automatic host mounts;
    ``--cleanenv`` drops the host environment; ``--net --network none`` leaves only loopback.
    """
    root = spec.container_root
    args = [binary, "exec", "--containall", "--cleanenv", "--no-home", "--writable-tmpfs"]
    if spec.network is not NetworkMode.HOST:
        args += ["--net", "--network", "none"]
    args += ["--bind", f"{host_root}:{root}"]
    if spec.network is NetworkMode.PROXY and spec.proxy_socket is not None:
        args += ["--bind", f"{spec.proxy_socket}:{root}/.polar/proxy.sock"]
    args += ["--pwd", str(cwd)]
    for key, value in sorted(env.items()):
        args += ["--env", f"{key}={value}"]
    args += [spec.image, *argv]
    return args


class ApptainerRuntime(SessionRuntime):
    """A host session directory plus ``apptainer exec`` per command (unverified; see the module docstring).

    Args:
        spec: The runtime spec (``kind`` apptainer, ``image`` set).
        session_id: Names the session directory.
        base_dir: Parent of session directories on the host.
    """

    def __init__(self, spec: RuntimeSpec, *, session_id: str, base_dir: Path) -> None:
        super().__init__(spec, session_id=session_id)
        self._dir = HostSessionDir((base_dir / session_id).absolute(), PurePosixPath(spec.container_root))
        self._started = False

    @property
    def root(self) -> PurePosixPath:
        """The session directory inside the container."""
        return self._dir.inner_root

    async def start(self) -> None:
        """Create the host session directory."""
        self._raise_if_cancelled()
        for sub in SESSION_SUBDIRS:
            (self._dir.host_root / sub).mkdir(parents=True, exist_ok=True)
        self._started = True

    async def stop(self) -> None:
        """Delete the host session directory. Idempotent."""
        self._started = False
        shutil.rmtree(self._dir.host_root, ignore_errors=True)

    def _check(self) -> None:
        self._raise_unless_started(self._started)
        if not self._dir.host_root.is_dir():
            raise RuntimeDied(f"session directory {self._dir.host_root} has vanished")

    def _own_variables(self) -> dict[str, str]:
        # Unverified runtime: only what it has always set (no tunnel runs here, so no POLAR_PROXY_URL).
        return {"HOME": str(self.root / "home"), "TMPDIR": str(self.root / "tmp")}

    async def exec(
        self,
        argv: Sequence[str],
        *,
        cwd: str | PurePosixPath | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float,  # noqa: ASYNC109 - enforced inside the sandbox, which kills the process group
    ) -> ExecResult:
        """Run a command with ``apptainer exec``."""
        self._check()
        inner_cwd = self.root if cwd is None else PurePosixPath(self._dir.inner_root / str(cwd))
        self._dir.host_path(inner_cwd)
        command = build_exec_argv(
            self._spec, host_root=self._dir.host_root, argv=argv, cwd=inner_cwd, env=self.environment(env)
        )
        return await run_process(command, cwd=None, env={"PATH": "/usr/local/bin:/usr/bin:/bin"}, timeout=timeout)

    async def upload(self, src: Path | bytes, dest: str | PurePosixPath, *, exclude: Sequence[str] = ()) -> None:
        """Copy into the host session directory."""
        self._check()
        await self._dir.upload(src, dest, exclude)

    async def download(self, src: str | PurePosixPath) -> bytes:
        """Read from the host session directory."""
        self._check()
        return await self._dir.download(src)
