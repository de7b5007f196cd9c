"""Test helpers: a private Docker daemon and an offline-built Python image (for integration tests).

Nothing here runs on import. ``start_private_dockerd`` starts ``dockerd`` as a child with its own data root,
exec root and socket (no default bridge, no iptables), so tests never touch a system daemon.
``ensure_python_image`` makes a Debian bookworm minbase image with python3 (and venv), pytest, git, bubblewrap and
ca-certificates: the root file system is built once per machine with ``debootstrap`` into ``cache_dir`` and then
``docker import``-ed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "IMAGE_CACHE",
    "PYTHON_IMAGE_TAG",
    "PrivateDockerd",
    "ensure_python_image",
    "private_docker",
    "start_private_dockerd",
]

PYTHON_IMAGE_TAG = "polar-test-python:bookworm"
IMAGE_CACHE = Path.home() / ".cache" / "polar" / "images"
"""Where :func:`ensure_python_image` keeps the root file system it builds (once per machine)."""
_ROOTFS_NAME = "debian-bookworm-python3-venv-pytest-git-bwrap-certs.tar"
# Bulky parts of the root file system that no test needs.
_STRIP = ("usr/share/doc", "usr/share/man", "usr/share/locale", "usr/share/info", "var/cache/apt",
          "var/lib/apt/lists")  # fmt: skip


@dataclasses.dataclass
class PrivateDockerd:
    """A running private ``dockerd``.

    Attributes:
        url: The daemon's ``unix://`` URL.
        process: The daemon process.
        workdir: Its data/exec root parent (removed by :meth:`stop`).
    """

    url: str
    process: subprocess.Popen[bytes]
    workdir: Path

    def client(self) -> Any:
        """A ``docker.DockerClient`` for this daemon."""
        import docker

        return docker.DockerClient(base_url=self.url, timeout=120)

    def stop(self) -> None:
        """Stop the daemon (SIGTERM, then SIGKILL) and delete its directories."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        # dockerd's containerd and shims share its process group (start_new_session); end them too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        # Container layers (data root) and network namespaces (exec root) may still be mounted; unmount them,
        # deepest first, before deleting.
        prefix = f"{self.workdir}/"
        with contextlib.suppress(OSError):
            mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
            for target in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
                subprocess.run(["umount", "-l", target], check=False, capture_output=True)
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_private_dockerd(timeout_s: float = 30.0) -> PrivateDockerd | None:
    """Start a private ``dockerd``; return ``None`` when it is not installed or does not come up."""
    binary = shutil.which("dockerd")
    if binary is None or os.geteuid() != 0:
        return None
    # Unix socket paths are limited to ~108 bytes: keep the directory short.
    workdir = Path(tempfile.mkdtemp(prefix="polar-dockerd-", dir="/tmp"))
    sock = workdir / "docker.sock"
    log = (workdir / "dockerd.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            "--data-root",
            str(workdir / "data"),
            "--exec-root",
            str(workdir / "exec"),
            "-H",
            f"unix://{sock}",
            "--pidfile",
            str(workdir / "dockerd.pid"),
            "--bridge",
            "none",
            "--iptables=false",
            "--ip6tables=false",
            "--shutdown-timeout",
            "2",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    daemon = PrivateDockerd(url=f"unix://{sock}", process=process, workdir=workdir)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        if sock.exists():
            with contextlib.suppress(Exception):
                daemon.client().ping()
                return daemon
        time.sleep(0.1)
    daemon.stop()
    return None


def _build_rootfs(cache_dir: Path) -> Path | None:
    tarball = cache_dir / _ROOTFS_NAME
    if tarball.exists():
        return tarball
    if shutil.which("debootstrap") is None:
        return None
    cache_dir.mkdir(parents=True, exist_ok=True)
    # One builder at a time (pytest-xdist workers, parallel test runs); the others wait and reuse its tarball.
    with (cache_dir / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if tarball.exists():
            return tarball
        return _debootstrap(tarball)


def _debootstrap(tarball: Path) -> Path | None:
    with tempfile.TemporaryDirectory(prefix="polar-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        built = subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                "--include=python3,python3-venv,python3-pytest,git,bubblewrap,ca-certificates",
                "bookworm",
                str(rootfs),
                "http://deb.debian.org/debian",
            ],
            capture_output=True,
            timeout=900,
            check=False,
        )
        if built.returncode != 0:
            return None
        for rel in _STRIP:
            shutil.rmtree(rootfs / rel, ignore_errors=True)
        partial = tarball.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], check=True, timeout=300)
        partial.replace(tarball)
    return tarball


def ensure_python_image(client: Any, cache_dir: Path) -> str | None:
    """Return the tag of an image with python3 (venv), pytest, git, bubblewrap and CA certificates, built as needed.

    Returns ``None`` when it cannot be built here (no debootstrap, or no Debian mirror reachable).
    """
    import docker.errors

    with contextlib.suppress(docker.errors.ImageNotFound):
        client.images.get(PYTHON_IMAGE_TAG)
        return PYTHON_IMAGE_TAG
    tarball = _build_rootfs(cache_dir)
    if tarball is None:
        return None
    repo, tag = PYTHON_IMAGE_TAG.split(":")
    with tarball.open("rb") as fh:
        client.api.import_image_from_data(fh, repository=repo, tag=tag)
    return PYTHON_IMAGE_TAG


@contextlib.contextmanager
def private_docker(cache_dir: Path = IMAGE_CACHE) -> Iterator[tuple[PrivateDockerd, Any, str]]:
    """A private ``dockerd``, a client of it and the Python test image; skips the test when either is missing.

    Yields:
        The daemon, a ``docker.DockerClient`` and the image tag; the client is closed and the daemon stopped
        on exit.
    """
    import pytest

    daemon = start_private_dockerd()
    if daemon is None:
        pytest.skip("no dockerd here (scripts/setup.sh installs docker.io)")
    client = daemon.client()
    try:
        image = ensure_python_image(client, cache_dir)
        if image is None:
            pytest.skip("cannot build the test image here (debootstrap)")
        yield daemon, client, image
    finally:
        client.close()
        daemon.stop()
