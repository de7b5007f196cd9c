"""The workspace disk quota's measurement and watchdog, and uploads that never follow a planted symlink."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path, PurePosixPath

import pytest

from polar_core.errors import InvalidArgument
from runtimes import PathEscapesSession, RuntimeSpec
from runtimes._hostdir import HostSessionDir
from runtimes._quota import allocated_bytes, watch_quota
from runtimes.errors import DiskQuotaExceeded


def test_allocated_bytes_counts_blocks_not_apparent_size(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "data.bin").write_bytes(b"x" * 1_000_000)
    with (tmp_path / "sparse.bin").open("wb") as fh:
        fh.truncate(2 * 1024**3)  # 2 GiB apparent, nothing allocated
    os.link(tmp_path / "sub" / "data.bin", tmp_path / "hardlink.bin")  # counted once
    os.symlink("/usr", tmp_path / "link")  # never followed
    used = allocated_bytes(tmp_path)
    assert 1_000_000 <= used < 1_500_000
    assert allocated_bytes(tmp_path / "missing") == 0
    assert allocated_bytes(tmp_path, stop_above=10) > 10


async def test_watchdog_kills_over_quota_and_lets_a_command_under_it_finish() -> None:
    usage = [0]
    killed: list[int] = []
    stop = asyncio.Event()

    async def measure() -> int:
        return usage[0]

    async def kill(used: int) -> None:
        killed.append(used)
        stop.set()

    async def command() -> str:
        usage[0] = 50
        await asyncio.sleep(0.3)
        usage[0] = 500
        await stop.wait()
        return "killed"

    result, breach = await watch_quota(command(), measure=measure, limit=100, on_exceeded=kill)
    assert (result, breach, killed) == ("killed", 500, [500])

    async def quick() -> str:
        return "done"

    assert await watch_quota(quick(), measure=measure, limit=1000, on_exceeded=kill) == ("done", None)


async def test_a_burst_between_samples_is_caught_when_the_command_ends() -> None:
    usage = [0]
    killed: list[int] = []

    async def measure() -> int:
        return usage[0]

    async def kill(used: int) -> None:
        killed.append(used)

    async def burst() -> int:
        usage[0] = 10_000
        return 0

    _result, breach = await watch_quota(burst(), measure=measure, limit=100, on_exceeded=kill)
    assert breach == 10_000


def test_disk_limit_is_a_size_or_none() -> None:
    assert RuntimeSpec().disk_limit == "4g"
    assert RuntimeSpec.from_mapping({"disk_limit": None}).disk_limit is None
    with pytest.raises(InvalidArgument):
        RuntimeSpec(disk_limit="lots")
    assert issubclass(DiskQuotaExceeded, InvalidArgument)


async def test_uploads_replace_planted_links_and_refuse_linked_directories(tmp_path: Path) -> None:
    root = tmp_path / "session"
    root.mkdir()
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret.txt").write_text("original\n")
    os.symlink(host / "secret.txt", root / "target")
    os.symlink(host, root / "hostdir")
    (root / "up").mkdir()
    os.symlink(host, root / "up" / "sub")
    session = HostSessionDir(root, PurePosixPath("/s"))
    await session.upload(b"new\n", "target", ())
    assert (host / "secret.txt").read_text() == "original\n"
    assert not (root / "target").is_symlink()
    with pytest.raises(PathEscapesSession):
        await session.upload(b"x", "hostdir/new.txt", ())
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "f.txt").write_text("f\n")
    await session.upload(tree, "up", ())
    assert (root / "up" / "sub" / "f.txt").read_text() == "f\n"
    assert sorted(p.name for p in host.iterdir()) == ["secret.txt"]
    for link in ("hostdir", "hostdir/secret.txt"):
        with pytest.raises(PathEscapesSession):
            await session.download(link)
