"""A session's writable space as a file system of its own size: a sparse ext4 image, loop-mounted.

Why an image and not a tmpfs: a tmpfs holds its files in memory, and a session's workspace (default quota 4 GiB,
several sessions per host) would then compete with the sandboxes' own memory on hosts with 24 GiB and no swap.
A sparse image occupies on the host only what the sandbox wrote, and the kernel refuses the write that would
pass its size (``ENOSPC``) instead of a watchdog killing the sandbox after the fact: nothing is ever written past
the quota. The image is made without a journal (it is scratch space: a crash deletes it) and with no blocks
reserved for root, so what a sandbox may allocate is the image's size minus ext4's metadata (about 5 % at
128 MiB, under 2 % at 4 GiB) — never more than ``disk_limit``.

This needs root (``mount``, a loop device) and ``mkfs.ext4``; :func:`unsupported` says why not, and the runtimes
then keep the watchdog of :mod:`runtimes._quota`. Images live in one directory per runtime factory
(``<base_dir>/.polar-disks``) as ``<name>.img``, and each is listed in the host-wide registry :data:`REGISTRY` (its
image and mount point); the owning process holds an exclusive ``flock`` on each image as long as its session lives.
:func:`sweep` unmounts and deletes every registered image whose lock is free (its owner crashed, wherever its
directory): the runtimes call it before each session starts.
Admission (:func:`check_space`) refuses a quota larger than the file system's free space minus what the live
images of that directory may still grow by, so sparse images never promise more disk than there is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

from runtimes.errors import DiskSpaceHeld, DiskSpaceUnavailable

__all__ = ["IMAGE_DIR_NAME", "REGISTRY", "SessionDisk", "check_space", "sweep", "unsupported"]

_log = logging.getLogger(__name__)

REGISTRY = Path("/run/polar-sandbox/disks")
"""Every session image of this host, one record per image: its path and its mount point (root's own, on tmpfs)."""
MOUNT_DIR = Path("/run/polar-sandbox/mnt")
"""Where images are mounted: never below a session's own directory tree, so a mount that outlives a crashed owner
cannot block whoever deletes that tree (the local runtime's session directory is a symlink to the mount)."""
IMAGE_DIR_NAME = ".polar-disks"
"""The directory below a local runtime's ``base_dir`` that holds its sessions' images."""
_TOOL_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
_MOUNT_OPTIONS = "loop,nosuid,nodev,noatime"
_UMOUNT_TRIES = 20
# ext4 keeps a little back (reserved clusters, metadata): after a write was refused, a few hundred KiB can still show
# as free. Less than this much free means the sandbox has reached its quota.
_FULL_MARGIN = 2 * 2**20
_FULL_SHARE = 50


def unsupported() -> str | None:
    """``None`` when this process can make loop-mounted images; else why not (one phrase)."""
    if os.geteuid() != 0:
        return "a loop-mounted image needs root"
    for tool in ("mkfs.ext4", "mount", "umount"):
        if shutil.which(tool, path=_TOOL_PATH) is None:
            return f"{tool} is not installed"
    if not Path("/dev/loop-control").exists():
        return "no loop devices (/dev/loop-control is missing)"
    return None


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env={"PATH": _TOOL_PATH}, timeout=60)
    if done.returncode != 0:
        raise OSError(f"{' '.join(argv[:2])} failed: {(done.stderr or done.stdout).strip()[-300:]}")


def _reserved(image: Path) -> int:
    """What an image may still grow by on the host: its size minus what it already occupies."""
    try:
        info = image.stat()
    except OSError:
        return 0
    return max(0, info.st_size - info.st_blocks * 512)


def check_space(image_dir: Path, size: int) -> None:
    """Refuse a ``size``-byte image when the host cannot hold it next to the live images of ``image_dir``.

    Raises:
        DiskSpaceUnavailable: ``size`` is larger than the free space: this host cannot hold it.
        DiskSpaceHeld: ``size`` fits the free space, not what is left once the live images have grown to their
            quotas: a shortage that ends as sessions end.
    """
    existing = next(p for p in (image_dir, *image_dir.parents) if p.exists())
    stat = os.statvfs(existing)
    free = stat.f_bavail * stat.f_frsize
    promised = sum(_reserved(image) for image in image_dir.glob("*.img"))
    if size > free - promised:
        error = DiskSpaceUnavailable if size > free else DiskSpaceHeld
        advice = "lower disk_limit or free disk space" if size > free else "it is retried when sessions end"
        raise error(
            f"the disk quota ({size // 2**20} MiB) is larger than the free space for sessions on {image_dir} "
            f"({max(0, free - promised) // 2**20} MiB: {free // 2**20} MiB free, {promised // 2**20} MiB promised "
            f"to running sessions); {advice}"
        )


def _umount(mountpoint: Path) -> None:
    """Unmount, retrying while killed processes still hold it; detach lazily as a last resort."""
    for _ in range(_UMOUNT_TRIES):
        if not os.path.ismount(mountpoint):
            return
        try:
            _run(["umount", str(mountpoint)])
            return
        except OSError:
            time.sleep(0.1)
    with contextlib.suppress(OSError):
        _run(["umount", "-l", str(mountpoint)])


@dataclasses.dataclass(slots=True)
class SessionDisk:
    """A mounted session image; :meth:`remove` unmounts and deletes it.

    Attributes:
        image: The image file on the host.
        mountpoint: Where it is mounted.
        size: Its size in bytes (the quota).
    """

    image: Path
    mountpoint: Path
    size: int
    _lock_fd: int = -1
    _record: Path | None = None

    @classmethod
    def create(
        cls,
        image_dir: Path,
        name: str,
        size: int,
        *,
        owner: tuple[int, int],
        registry: Path = REGISTRY,
        mount_dir: Path = MOUNT_DIR,
    ) -> SessionDisk:
        """Make a sparse ext4 image ``<image_dir>/<name>.img`` of ``size`` bytes owned by ``owner``, and mount it in
        ``mount_dir`` (blocking).

        Raises:
            DiskSpaceUnavailable: The host has not the space (:func:`check_space`).
            DiskSpaceHeld: Not now: running sessions' quotas hold it (:func:`check_space`).
            OSError: The image could not be made or mounted.
        """
        check_space(image_dir, size)
        unique = f"{name}-{uuid.uuid4().hex[:12]}"
        mountpoint = mount_dir / unique
        image, partial = image_dir / f"{name}.img", image_dir / f".{name}.new"
        registry.mkdir(mode=0o700, parents=True, exist_ok=True)
        record = registry / unique
        # Locked before it gets the name the sweep looks for, so a sweep in another process never takes it.
        fd = _create(partial)
        disk = cls(image, mountpoint, size, fd, record)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(fd, size)
            os.rename(partial, image)
            record.write_text(f"{image}\n{mountpoint}\n")
            uid, gid = owner
            _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", "-E",
                  f"nodiscard,root_owner={uid}:{gid}", "-L", "polar-session", str(image)])  # fmt: skip
            mount_dir.mkdir(mode=0o711, parents=True, exist_ok=True)
            for traversed in (mount_dir.parent, mount_dir):  # whatever the umask: the leased id passes through
                os.chmod(traversed, 0o711)
            mountpoint.mkdir()
            _run(["mount", "-o", _MOUNT_OPTIONS, str(image), str(mountpoint)])
            # ext4's lost+found would show in the session directory; nothing here ever runs fsck.
            with contextlib.suppress(OSError):
                (mountpoint / "lost+found").rmdir()
        except BaseException:
            disk.remove()
            with contextlib.suppress(OSError):
                partial.unlink()
            raise
        return disk

    def full(self) -> bool:
        """Whether the sandbox reached its quota: less than 2 % (at least 2 MiB) free, or no inode left (blocking)."""
        stat = os.statvfs(self.mountpoint)
        return stat.f_bavail * stat.f_frsize < max(_FULL_MARGIN, self.size // _FULL_SHARE) or stat.f_favail == 0

    def quota_message(self, what: str) -> str:
        """The reason a session ends with once :meth:`full`."""
        return f"{what} filled its disk quota (quota {self.size // 2**20} MiB; the writes past it were refused)"

    def remove(self) -> None:
        """Unmount the image, delete it and its mount point's directory. Idempotent; errors are logged."""
        _umount(self.mountpoint)
        if _discard(self.image, self.mountpoint) and self._record is not None:
            with contextlib.suppress(FileNotFoundError):
                self._record.unlink()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1


def _discard(image: Path, mountpoint: Path) -> bool:
    """Delete an unmounted image and its empty mount point; ``False`` (nothing deleted) while still mounted."""
    if os.path.ismount(mountpoint):
        _log.warning("cannot unmount the session image at %s; it stays until the next sweep", mountpoint)
        return False
    with contextlib.suppress(OSError):
        mountpoint.rmdir()  # empty once unmounted; a caller that wants its directory gone removes the rest
    with contextlib.suppress(FileNotFoundError):
        image.unlink()
    with contextlib.suppress(OSError):
        image.parent.rmdir()  # the last image of its directory: leave nothing behind in base_dir
    return True


def _create(path: Path) -> int:
    """Create ``path`` exclusively, making its directory again should another owner's cleanup just remove it."""
    for _ in range(3):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            continue
    raise OSError(f"cannot create {path}: its directory keeps vanishing")


def sweep(registry: Path = REGISTRY) -> list[Path]:
    """Unmount and delete the registered images whose owner is gone (their lock is free), wherever they are.

    Returns:
        The mount points of the images removed.
    """
    removed: list[Path] = []
    if not registry.is_dir():
        return removed
    for record in sorted(registry.iterdir()):
        try:
            image_text, mount_text = record.read_text().splitlines()[:2]
        except (OSError, ValueError):
            continue  # being written, or already gone
        image, mountpoint = Path(image_text), Path(mount_text)
        try:
            fd = os.open(image, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = -1  # deleted, perhaps while still mounted
        try:
            if fd >= 0:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a live session's
            _umount(mountpoint)
            if not os.path.ismount(mountpoint):
                shutil.rmtree(mountpoint, ignore_errors=True)
            if _discard(image, mountpoint):
                with contextlib.suppress(FileNotFoundError):
                    record.unlink()
                removed.append(mountpoint)
        finally:
            if fd >= 0:
                os.close(fd)
    if removed:
        _log.warning("removed %d session image(s) left by a process that ended: %s", len(removed),
                     ", ".join(map(str, removed)))  # fmt: skip
    return removed
