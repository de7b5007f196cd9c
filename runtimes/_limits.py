"""Resource limits of the local runtime: cgroups where this process may create them, rlimits otherwise.

Per-process rlimits (``prlimit``) are always set: address-space-free data size (``RLIMIT_DATA``, so V8's large
``PROT_NONE`` reservations still work), CPU seconds, file size, open files, no core dumps, and ``RLIMIT_NPROC``
(which the kernel does not enforce for host uid 0). Where a ``pids`` / ``memory`` cgroup can be created here —
cgroup v2 with the controller enabled for our cgroup's children, or a writable v1 hierarchy (root) — each
session gets its own cgroup with ``pids.max`` and a memory maximum for the whole sandbox. :func:`probe_limits`
says once which limits hold on this host; the runtime logs what is not enforced. The workspace disk quota is a
loop-mounted image as root (:mod:`runtimes._diskimage`), else the watchdog of :mod:`runtimes._quota`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import shutil
import time
import uuid
from pathlib import Path

__all__ = ["CgroupPlan", "LimitProbe", "cgroup_name", "parse_size", "prlimit_argv", "probe_limits", "unique_name"]

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def parse_size(text: str | int) -> int:
    """Bytes of a size such as ``"4g"``, ``"512m"``, ``"1GiB"`` or an integer.

    Raises:
        ValueError: Not a size.
    """
    if isinstance(text, int):
        return text
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"not a size: {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def prlimit_argv(*, data_bytes: int, nproc: int, cpu_s: int | None, fsize_bytes: int, nofile: int = 4096) -> list[str]:
    """The ``prlimit`` prefix that applies the per-process limits to the command after it."""
    argv = ["prlimit", f"--data={data_bytes}", f"--nproc={nproc}", f"--fsize={fsize_bytes}", f"--nofile={nofile}",
            "--core=0"]  # fmt: skip
    if cpu_s is not None:
        argv.append(f"--cpu={cpu_s}")
    return [*argv, "--"]


def unique_name(session_id: str, *, keep: int) -> str:
    """A fresh host-object name for a runtime of ``session_id``: ``polar-<session id>-<random>``.

    Unique per runtime (the gateway's and the evaluator's runtimes of one session, a retried attempt, and
    another run of the same task may share a host); the session id is kept for whoever reads it, with anything
    but ``[A-Za-z0-9_.-]`` made ``_`` (a ``/`` would leave a cgroup's parent; Docker refuses it) and cut to
    ``keep`` characters.
    """
    readable = _NAME_UNSAFE.sub("_", session_id)[:keep] or "_"
    return f"polar-{readable}-{uuid.uuid4().hex[:12]}"


def cgroup_name(session_id: str) -> str:
    """A fresh cgroup name for a runtime of ``session_id`` (:func:`unique_name`, 64 characters of the id)."""
    return unique_name(session_id, keep=64)


@dataclasses.dataclass(frozen=True, slots=True)
class CgroupPlan:
    """Where per-session cgroups go, per controller (``None``: cannot be created here).

    Attributes:
        pids: Parent directory for per-session ``pids`` cgroups.
        memory: Parent directory for per-session ``memory`` cgroups.
        v2: Whether the parents are cgroup v2 (else v1 hierarchies).
    """

    pids: Path | None = None
    memory: Path | None = None
    v2: bool = False

    def create(self, session_id: str, *, pids_max: int, memory_max: int) -> list[Path]:
        """Create the session's cgroups with their limits; returns the directories (join each, remove at end)."""
        made: list[Path] = []
        name = cgroup_name(session_id)
        if self.v2 and self.pids is not None:
            path = self.pids / name
            path.mkdir(exist_ok=True)
            (path / "pids.max").write_text(str(pids_max))
            if self.memory is not None:
                (path / "memory.max").write_text(str(memory_max))
                with contextlib.suppress(OSError):
                    (path / "memory.swap.max").write_text("0")
            return [path]
        if self.pids is not None:
            path = self.pids / name
            path.mkdir(exist_ok=True)
            (path / "pids.max").write_text(str(pids_max))
            made.append(path)
        if self.memory is not None:
            path = self.memory / name
            path.mkdir(exist_ok=True)
            (path / "memory.limit_in_bytes").write_text(str(memory_max))
            made.append(path)
        return made


def remove_cgroups(paths: list[Path]) -> None:
    """Remove per-session cgroups, waiting briefly for killed processes to leave; errors are ignored."""
    for path in paths:
        for _ in range(50):
            try:
                path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.05)


@dataclasses.dataclass(frozen=True, slots=True)
class LimitProbe:
    """What this host lets the local runtime enforce.

    Attributes:
        prlimit: Whether ``prlimit`` is installed (data size, CPU time, file size, open files, processes).
        cgroups: Where per-session cgroups can be created.
        root: Whether this process runs as root (``RLIMIT_NPROC`` does not bind host uid 0).
    """

    prlimit: bool
    cgroups: CgroupPlan
    root: bool

    def not_enforced(self) -> list[str]:
        """One phrase per limit that does not hold on this host."""
        missing: list[str] = []
        if not self.prlimit:
            missing.append("per-process limits (prlimit is not installed: data size, CPU time, file size)")
        if self.cgroups.pids is None and (self.root or not self.prlimit):
            missing.append("process count (no pids cgroup, and RLIMIT_NPROC does not bind root)")
        elif self.cgroups.pids is None:
            missing.append("a per-session process count (RLIMIT_NPROC counts all processes of the host user)")
        if self.cgroups.memory is None:
            missing.append("a total memory limit per sandbox (only the per-process data size)")
        return missing


def _own_cgroup_v2() -> Path | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return Path(line[3:])
    return None


def _v1_path(controller: str) -> Path | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _id, names, path = line.split(":", 2)
            if controller in names.split(","):
                return Path(path)
    return None


def _writable_dir(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def _plan_v2(mount: Path) -> CgroupPlan | None:
    own = _own_cgroup_v2()
    if own is None:
        return None
    # A process may not stay in a cgroup whose children have controllers (no internal processes), so the
    # session cgroups go next to ours: under our parent, when that delegates the controllers to its children.
    parent = mount / own.relative_to("/").parent if own != Path("/") else mount
    with contextlib.suppress(OSError):
        enabled = (parent / "cgroup.subtree_control").read_text().split()
        if "pids" in enabled and _writable_dir(parent):
            return CgroupPlan(pids=parent, memory=parent if "memory" in enabled else None, v2=True)
    return None


@functools.cache
def _probe_cgroups() -> CgroupPlan:
    if (_CGROUP_ROOT / "cgroup.controllers").exists():
        return _plan_v2(_CGROUP_ROOT) or CgroupPlan()
    found: dict[str, Path] = {}
    for controller in ("pids", "memory"):
        own = _v1_path(controller)
        base = _CGROUP_ROOT / controller
        if own is None or not (base / "cgroup.procs").exists():
            continue
        parent = base / own.relative_to("/")
        if _writable_dir(parent):
            found[controller] = parent
    return CgroupPlan(pids=found.get("pids"), memory=found.get("memory"))


def probe_limits() -> LimitProbe:
    """Probe (once per process for cgroups) which limits the local runtime can enforce here."""
    return LimitProbe(prlimit=shutil.which("prlimit") is not None, cgroups=_probe_cgroups(), root=os.geteuid() == 0)
