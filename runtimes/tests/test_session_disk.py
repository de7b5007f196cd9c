"""Session images (admission, the crash sweep) and leased host ids, without mounting anything."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from polar_core.errors import Unavailable
from runtimes._diskimage import check_space, sweep
from runtimes._hostids import HostIdRange, _passable, lease_host_id, sweep_leases
from runtimes.errors import DiskSpaceHeld, DiskSpaceUnavailable


class _StatVfs:
    def __init__(self, free: int) -> None:
        self.f_bavail, self.f_frsize = free // 4096, 4096


def test_admission_counts_what_live_images_may_still_grow_by(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "statvfs", lambda _: _StatVfs(1024 * 2**20))
    check_space(tmp_path, 1000 * 2**20)  # 1 GiB free, nothing promised
    with (tmp_path / "live.img").open("wb") as image:
        image.truncate(600 * 2**20)  # a live session's sparse image may still grow by 600 MiB
    # 500 MiB fits the free space but not what the live image may still take: a shortage that passes (an outage).
    with pytest.raises(DiskSpaceHeld, match=r"larger than the free space.*424 MiB.*600 MiB promised.*retried"):
        check_space(tmp_path, 500 * 2**20)
    check_space(tmp_path, 400 * 2**20)
    # Larger than the free space itself: this host cannot hold it at all.
    with pytest.raises(DiskSpaceUnavailable, match=r"lower disk_limit or free disk space"):
        check_space(tmp_path, 1100 * 2**20)
    assert issubclass(DiskSpaceHeld, Unavailable)
    assert not issubclass(DiskSpaceUnavailable, Unavailable)


def _record(registry: Path, name: str, image: Path, mountpoint: Path) -> Path:
    registry.mkdir(exist_ok=True)
    record = registry / name
    record.write_text(f"{image}\n{mountpoint}\n")
    return record


def test_the_sweep_removes_only_images_whose_owner_is_gone(tmp_path: Path) -> None:
    registry, images = tmp_path / "registry", tmp_path / "images"
    images.mkdir()
    orphan, live = images / "orphan.img", images / "live.img"
    orphan.write_bytes(b"")
    live.write_bytes(b"")
    orphan_mount, live_mount = tmp_path / "mnt-orphan", tmp_path / "mnt-live"
    for mount in (orphan_mount, live_mount):
        mount.mkdir()
        (mount / "left.txt").write_text("x")  # what an unmounted mount point may still hold
    orphan_record = _record(registry, "orphan-1", orphan, orphan_mount)
    live_record = _record(registry, "live-1", live, live_mount)
    gone_record = _record(registry, "gone-1", images / "gone.img", tmp_path / "mnt-gone")
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # its owner lives
    try:
        removed = sweep(registry)
    finally:
        os.close(fd)
    assert sorted(removed) == sorted([orphan_mount, tmp_path / "mnt-gone"])
    assert not orphan.exists()
    assert not orphan_mount.exists()
    assert not orphan_record.exists()
    assert not gone_record.exists()
    assert live.exists()
    assert live_record.exists()
    assert (live_mount / "left.txt").exists()


def test_host_ids_are_leased_exclusively_and_freed(tmp_path: Path) -> None:
    ids = HostIdRange(base=800_000_000, count=2, lock_dir=tmp_path / "ids")
    first, second = lease_host_id(ids), lease_host_id(ids)
    assert {first.uid, second.uid} == {800_000_000, 800_000_001}
    assert (first.staging.stat().st_mode & 0o777) == 0o711
    with pytest.raises(OSError, match="all 2 sandbox host ids"):
        lease_host_id(ids)
    first.release()
    again = lease_host_id(ids)
    assert again.uid == first.uid
    again.release()
    second.release()


def test_staging_of_a_dead_lease_is_cleared(tmp_path: Path) -> None:
    ids = HostIdRange(base=800_000_000, count=1, lock_dir=tmp_path / "ids")
    lease = lease_host_id(ids)
    (lease.staging / "1").mkdir()  # as a crashed owner leaves it (here: no mount)
    assert sweep_leases(ids) == 0  # its owner lives
    lease._fd, fd = -1, lease._fd
    os.close(fd)  # the owner "crashes": its lock is free
    assert sweep_leases(ids) == 1
    assert list(lease.staging.iterdir()) == []


def test_paths_closed_to_other_users_are_not_passable(tmp_path: Path) -> None:
    (tmp_path / "open").mkdir(mode=0o755)
    assert _passable(tmp_path / "open", os.getuid())  # every parent is ours or lets others through
    stranger = 812_345_678
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    assert not _passable(closed, stranger)
    closed.chmod(0o755)
    parents_open = all(p.stat().st_mode & 0o001 for p in closed.parents)
    assert _passable(closed, stranger) == parents_open
