"""Host user ids for sandboxes started by root: one unprivileged host uid (and gid) per live local runtime.

bubblewrap started by root maps the sandbox's user to the caller, so every sandboxed process was host uid 0
(without capabilities): anything that regained them would be root on the host. Instead, a root runtime leases a
host id from :class:`HostIdRange` and starts bubblewrap *as that id* (``setpriv --reuid --regid
--clear-groups``): bubblewrap then runs unprivileged, and maps the sandbox's ``sandbox_uid`` to the leased id,
which owns nothing on the host but the session's files. Each live runtime has its own id, so ``RLIMIT_NPROC``
counts one session's processes, and no two sandboxes share an owner.

The default range, 700000000–700065535, lies above what ``useradd`` hands out in ``/etc/subuid`` and
``/etc/subgid`` (``SUB_UID_MAX`` 600100000 by default), so it overlaps no user's subordinate ids; an operator
whose host uses it otherwise sets another (:class:`runtimes.local.LocalHost`). A lease is an exclusive ``flock`` on
``<lock_dir>/<uid>.lock`` held while the runtime lives (gateway and evaluator processes on one host share the
directory): a crashed owner's lock is free again at once.

bubblewrap running as the leased id must reach what it binds, and directories such as ``/tmp/pytest-of-root``
or ``/root`` are closed to other users. :meth:`HostIdLease.reachable` returns such a path as is when every parent
lets others through, else bind-mounts it (as root, on the host) below the lease's own staging directory
``<lock_dir>/<uid>/`` (mode 0711), which the runtime binds instead; :meth:`HostIdLease.release` unmounts them, and
the next lease of the same id clears whatever a crashed owner left there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import random
import stat
import subprocess
from pathlib import Path

__all__ = ["HostIdLease", "HostIdRange", "lease_host_id", "sweep_leases"]

_TOOL_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


@dataclasses.dataclass(frozen=True, slots=True)
class HostIdRange:
    """The host ids root's sandboxes run as.

    Attributes:
        base: The first host uid/gid.
        count: How many (at most this many runtimes live at once on the host).
        lock_dir: Where leases are held (root's own, shared by every Polar process of the host).
    """

    base: int = 700_000_000
    count: int = 65536
    lock_dir: Path = Path("/run/polar-sandbox")


def _mounts_below(path: Path) -> list[str]:
    """Mount points at or below ``path`` (deepest first), from this process's mount table."""
    prefix = str(path)
    found: list[str] = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return sorted(found, key=len, reverse=True)


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env={"PATH": _TOOL_PATH}, timeout=60)
    if done.returncode != 0:
        raise OSError(f"{' '.join(argv[:2])} failed: {(done.stderr or done.stdout).strip()[-300:]}")


def _unmount_all(path: Path) -> None:
    for point in _mounts_below(path):
        with contextlib.suppress(OSError):
            _run(["umount", "-l", point])


def _passable(path: Path, uid: int) -> bool:
    """Whether ``uid`` (in no group) may traverse every directory from ``/`` to ``path`` and read ``path``."""
    for part in [*reversed(path.parents), path]:
        try:
            info = part.stat()
        except OSError:
            return False
        bits = (info.st_mode >> 6) & 7 if info.st_uid == uid else info.st_mode & 7
        needed = 1 if part != path else (5 if stat.S_ISDIR(info.st_mode) else 4)
        if bits & needed != needed:
            return False
    return True


@dataclasses.dataclass(slots=True)
class HostIdLease:
    """One leased host id; release it when the runtime ends.

    Attributes:
        uid: The host uid (and gid) the sandbox runs as.
        staging: Where paths closed to ``uid`` are bind-mounted for bubblewrap to reach.
    """

    uid: int
    staging: Path
    _fd: int = -1
    _staged: int = 0

    def reachable(self, path: Path, *, writable: bool = False) -> Path:
        """``path`` itself when the sandbox's id can reach it, else a bind mount of it in :attr:`staging`."""
        if _passable(path, self.uid):
            return path
        self._staged += 1
        target = self.staging / str(self._staged)
        if path.is_dir():
            target.mkdir(exist_ok=True)
        else:
            target.touch(exist_ok=True)
        _run(["mount", "--bind", str(path), str(target)])
        if not writable:
            _run(["mount", "-o", "remount,bind,ro,nosuid,nodev", str(target)])
        return target

    def release(self) -> None:
        """Unmount what was staged and free the id. Idempotent."""
        if self._fd < 0:
            return
        _clear(self.staging)
        os.close(self._fd)
        self._fd = -1


def _clear(staging: Path) -> None:
    _unmount_all(staging)
    if staging.is_dir():
        for entry in staging.iterdir():
            with contextlib.suppress(OSError):
                if entry.is_dir() and not entry.is_symlink():
                    entry.rmdir()
                else:
                    entry.unlink()


def sweep_leases(ids: HostIdRange) -> int:
    """Unmount what crashed owners staged (their lease is free); returns how many staging directories were cleared.

    A staged bind of a session directory keeps that session's image busy: run this before sweeping images.
    """
    cleared = 0
    if not ids.lock_dir.is_dir():
        return cleared
    for staging in ids.lock_dir.iterdir():
        if not staging.name.isdigit() or not staging.is_dir() or not any(staging.iterdir()):
            continue
        try:
            fd = os.open(ids.lock_dir / f"{staging.name}.lock", os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a live runtime's
        else:
            _clear(staging)
            cleared += 1
        finally:
            os.close(fd)
    return cleared


def lease_host_id(ids: HostIdRange) -> HostIdLease:
    """Lease a free host id of ``ids`` (root only); clears what a crashed earlier owner of it staged.

    Raises:
        OSError: Every id of the range is in use, or the lock directory cannot be made.
    """
    ids.lock_dir.mkdir(mode=0o711, parents=True, exist_ok=True)
    os.chmod(ids.lock_dir, 0o711)  # bubblewrap, running as a leased id, passes through to its staging directory
    start = random.randrange(ids.count)
    for step in range(ids.count):
        uid = ids.base + (start + step) % ids.count
        fd = os.open(ids.lock_dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        staging = ids.lock_dir / str(uid)
        _clear(staging)
        staging.mkdir(mode=0o711, exist_ok=True)
        os.chmod(staging, 0o711)
        return HostIdLease(uid, staging, fd)
    raise OSError(f"all {ids.count} sandbox host ids from {ids.base} are in use")
