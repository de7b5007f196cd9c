"""File transfer into and out of a session directory that lives on the host (local and apptainer)."""

from __future__ import annotations

import asyncio
import fnmatch
import os
import shutil
from collections.abc import Sequence
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

    def __init__(self, host_root: Path, inner_root: PurePosixPath) -> None:
        self.host_root = host_root
        self.inner_root = inner_root

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
        """Copy a host file/directory or bytes to ``dest``."""
        target = self.host_path(dest)
        self._check_real(target.parent)
        await asyncio.to_thread(_copy_in, src, target, tuple(exclude))
        self._check_real(target)

    async def download(self, src: str | PurePosixPath) -> bytes:
        """Read a regular file."""
        source = self.host_path(src)
        self._check_real(source)
        if not source.is_file():
            raise NotFound(f"no regular file {src} in the session directory")
        return await asyncio.to_thread(_read_capped, source, DOWNLOAD_LIMIT_BYTES)


def _read_capped(path: Path, limit: int) -> bytes:
    with path.open("rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(f"{path.name} is larger than the download limit ({limit} bytes)")
    return data


def _copy_in(src: Path | bytes, target: Path, exclude: tuple[str, ...]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(src, bytes):
        target.write_bytes(src)
        return
    if src.is_dir():

        def ignore(_dir: str, names: list[str]) -> set[str]:
            return {n for n in names if any(fnmatch.fnmatch(n, pat) for pat in exclude)}

        # symlinks=True: copy links as links, so a link in the source never pulls in host files.
        shutil.copytree(src, target, symlinks=True, ignore=ignore, dirs_exist_ok=True)
    else:
        shutil.copyfile(src, target)
