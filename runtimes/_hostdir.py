"""File transfer into and out of a session directory that lives on the host (local and apptainer)."""

from __future__ import annotations

import asyncio
import fnmatch
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath

from polar_core.errors import NotFound
from runtimes._process import DOWNLOAD_LIMIT_BYTES
from runtimes.base import resolve_in_root
from runtimes.errors import FileTooLarge, PathEscapesSession

__all__ = ["HostSessionDir"]


class HostSessionDir:
    """A session directory on the host, mapped to ``inner_root`` inside the sandbox.

    Paths are checked twice: lexically (``..``) and after resolving symlinks, so a symlink planted inside the
    session directory cannot make ``download`` read, or ``upload`` write, a host file outside it.
    """

    def __init__(self, host_root: Path, inner_root: PurePosixPath, owner: tuple[int, int] | None = None) -> None:
        self.host_root = host_root
        self.inner_root = inner_root
        # The host uid/gid the sandbox runs as when that is not this process's (root's sandboxes): what is
        # uploaded becomes theirs, so the sandbox can edit it.
        self.owner = owner

    def host_path(self, path: str | PurePosixPath) -> Path:
        """Map a path inside the sandbox to its host path, refusing anything outside the session directory."""
        inner = resolve_in_root(self.inner_root, path)
        return self.host_root / inner.relative_to(self.inner_root)

    def _check_real(self, host: Path) -> None:
        real_root = os.path.realpath(self.host_root)
        real = os.path.realpath(host)
        if real != real_root and not real.startswith(real_root + os.sep):
            raise PathEscapesSession(f"path {host} resolves outside the session directory")

    async def upload(self, src: Path | bytes, dest: str | PurePosixPath, exclude: Sequence[str]) -> None:
        """Copy a host file/directory or bytes to ``dest``; a symlink the sandbox left there is replaced, never
        followed, and nothing is written through a directory that resolves outside the session directory."""
        target = self.host_path(dest)
        self._check_real(target.parent)
        # The highest directory the copy creates: it and everything below become the sandbox's.
        created = target
        while created.parent != self.host_root and not created.parent.exists():
            created = created.parent
        await asyncio.to_thread(_copy_in, src, target, tuple(exclude), self._check_real)
        self._check_real(target)
        if self.owner is not None:
            await asyncio.to_thread(_chown_tree, created, self.owner)

    async def download(self, src: str | PurePosixPath) -> bytes:
        """Read a regular file."""
        source = self.host_path(src)
        self._check_real(source)
        if not source.is_file():
            raise NotFound(f"no regular file {src} in the session directory")
        return await asyncio.to_thread(_read_capped, source, DOWNLOAD_LIMIT_BYTES)


def _chown_tree(path: Path, owner: tuple[int, int]) -> None:
    """Give ``path`` and everything below it to ``owner``; links themselves, never what they point to."""
    uid, gid = owner
    os.lchown(path, uid, gid)
    if path.is_dir() and not path.is_symlink():
        for directory, dirs, files in os.walk(path):
            for name in (*dirs, *files):
                os.lchown(os.path.join(directory, name), uid, gid)


def _read_capped(path: Path, limit: int) -> bytes:
    # O_NOFOLLOW: a link swapped in after the check is refused, not followed.
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(f"{path.name} is larger than the download limit ({limit} bytes)")
    return data


def _write_new(target: Path, data: bytes | None, src: Path | None = None) -> None:
    """Write ``target`` as a fresh regular file: a symlink at its place is removed, never followed."""
    if target.is_symlink():
        target.unlink()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as out:
        if data is not None:
            out.write(data)
        elif src is not None:
            with src.open("rb") as fh:
                shutil.copyfileobj(fh, out)


def _copy_in(src: Path | bytes, target: Path, exclude: tuple[str, ...], check: Callable[[Path], None]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    check(target.parent)
    if isinstance(src, bytes):
        _write_new(target, src)
    elif src.is_dir():
        _copy_tree(src, target, exclude, check)
    else:
        _write_new(target, None, src)


def _copy_tree(src: Path, dest: Path, exclude: tuple[str, ...], check: Callable[[Path], None]) -> None:
    """Copy a directory; links in ``src`` are copied as links (never pulling in host files), and a link the
    sandbox planted in ``dest`` is replaced, never followed."""
    if dest.is_symlink():
        dest.unlink()
    dest.mkdir(exist_ok=True)
    check(dest)
    with os.scandir(src) as entries:
        for entry in entries:
            if any(fnmatch.fnmatch(entry.name, pat) for pat in exclude):
                continue
            out = dest / entry.name
            if entry.is_symlink():
                if out.is_symlink() or out.is_file():
                    out.unlink()
                elif out.is_dir():
                    shutil.rmtree(out)
                os.symlink(os.readlink(entry.path), out)
            elif entry.is_dir():
                _copy_tree(Path(entry.path), out, exclude, check)
            else:
                _write_new(out, None, Path(entry.path))
                shutil.copystat(entry.path, out, follow_symlinks=False)
    shutil.copystat(src, dest, follow_symlinks=False)
