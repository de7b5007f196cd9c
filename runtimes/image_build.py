"""Building a task's environment image from its Dockerfile, offline, once per content hash (Harbor tasks).

A Harbor task's ``environment/`` is a Docker build context. :func:`build_environment` builds it on the given
Docker daemon without pulling anything (``pull=False``, ``network_mode=none``): every ``FROM`` base must already
be on that daemon, else the build is refused with the field named before docker is asked. Two images result:

* ``polar-harbor-base/<name>:<hash>``: the task's own Dockerfile, as Harbor builds it;
* ``polar-harbor/<name>:<hash>``: that image plus one Polar layer, the one a task names as its runtime image.

Harbor tasks assume absolute paths: the agent works in the Dockerfile's ``WORKDIR`` (``/app``), the verifier's
tests are copied to ``/tests`` and write their reward under ``/logs/verifier``. Polar's container runtimes run
commands as an unprivileged user on a read-only root, with one writable session directory (``container_root``,
``/polar/session``). The Polar layer therefore turns ``WORKDIR`` into a symlink to ``<root>/workspace`` (the
workspace the gateway lays out and takes the patch of), ``/tests`` into ``<root>/tests`` and ``/logs`` into
``<root>/logs``. The original ``WORKDIR`` contents are copied out of the image into a host directory
(``workdir_dir``): the workspace's base, which the gateway copies in and diffs against.

The hash covers every file of the build context (path, mode, bytes), the prebuilt ``docker_image`` when one is
named, the container root and :data:`BUILD_VERSION`; an image whose tag exists is never rebuilt.

A task that names a prebuilt ``docker_image`` (every Terminal-Bench 2.0 task names one in a registry) is refused
when that image is not on the daemon, since nothing is pulled, unless the operator allows building the task's
own ``environment/Dockerfile`` instead (``build_missing_image``: Harbor's ``--force-build``). That build is the
same offline build under the same rules as a Dockerfile-only task's (no pull, no network, every ``FROM`` base
already present, the ``WORKDIR`` checks), logged at WARNING, tagged only with Polar's own tags: the registry name
the task gave is never created, so a task file cannot plant an image under a name other tasks or runtimes trust.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import os
import re
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

import docker
import docker.errors

from polar_core.errors import FailedPrecondition, InvalidArgument

__all__ = [
    "BUILD_MISSING_HOW",
    "BUILD_VERSION",
    "BuiltEnvironment",
    "build_environment",
    "context_hash",
    "dockerfile_bases",
    "image_tags",
]

BUILD_VERSION = "1"
"""Bumped whenever the Polar layer changes, so old images are not reused."""
DEFAULT_CONTAINER_ROOT = "/polar/session"
BUILD_MISSING_HOW = "`polar run/submit --build-missing-images`, or the setting POLAR_BUILD_MISSING_IMAGES=1"
"""How an operator allows building a missing ``docker_image`` from the task's Dockerfile (named in refusals)."""
_log = logging.getLogger(__name__)
_MARKER = "built.json"
# Where a WORKDIR may not be: replacing these with a symlink would break the image itself.
_SYSTEM_DIRS = ("/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/sbin", "/sys", "/usr", "/var",
                "/tmp", "/run", "/polar", "/logs", "/tests")  # fmt: skip
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/-]+$")
_FROM = re.compile(r"^\s*FROM\s+(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?\s*$", re.IGNORECASE)


@dataclasses.dataclass(frozen=True, slots=True)
class BuiltEnvironment:
    """A built environment.

    Attributes:
        image: The runtime image (with the Polar layer).
        workdir: The image's ``WORKDIR`` (a symlink to the session workspace in ``image``).
        workdir_dir: Host copy of the original ``WORKDIR`` contents: the workspace's base.
        content_hash: The hash the tags carry.
    """

    image: str
    workdir: str
    workdir_dir: Path
    content_hash: str


def _slug(name: str) -> str:
    slug = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip(".-_") or "task"
    return slug[:64]


def context_hash(env_dir: Path, *, docker_image: str = "", container_root: str = DEFAULT_CONTAINER_ROOT) -> str:
    """SHA-256 over the build context's files (sorted paths, modes, bytes) and what else shapes the image."""
    digest = hashlib.sha256(f"polar-harbor-{BUILD_VERSION}\0{docker_image}\0{container_root}\0".encode())
    if env_dir.is_dir():
        for path in sorted(env_dir.rglob("*")):
            rel = path.relative_to(env_dir).as_posix()
            if path.is_symlink():
                digest.update(f"L{rel}\0{os.readlink(path)}\0".encode())
            elif path.is_file():
                digest.update(f"F{rel}\0{path.stat().st_mode & 0o777}\0".encode())
                digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def image_tags(name: str, content_hash: str) -> tuple[str, str]:
    """``(base tag, runtime tag)`` of a task's environment."""
    return f"polar-harbor-base/{_slug(name)}:{content_hash[:16]}", f"polar-harbor/{_slug(name)}:{content_hash[:16]}"


def dockerfile_bases(text: str) -> list[str]:
    """The images a Dockerfile's ``FROM`` lines name, without ``scratch`` and earlier build stages.

    Raises:
        InvalidArgument: A ``FROM`` line Polar cannot read, or one whose image is a build argument (``$VAR``: its
            value cannot be checked before the build).
    """
    bases: list[str] = []
    stages: set[str] = set()
    joined = re.sub(r"\\\r?\n", " ", text)
    for line in joined.splitlines():
        if not re.match(r"^\s*FROM\s", line, re.IGNORECASE):
            continue
        match = _FROM.match(line)
        if match is None:
            raise InvalidArgument(f"environment/Dockerfile: cannot read {line.strip()!r}",
                                  details={"field": "environment/Dockerfile"})  # fmt: skip
        image, stage = match.group(1), match.group(2)
        if "$" in image:
            raise InvalidArgument(
                f"environment/Dockerfile: FROM {image} uses a build argument; name the base image literally",
                details={"field": "environment/Dockerfile"},
            )
        if image.lower() != "scratch" and image not in stages and image not in bases:
            bases.append(image)
        if stage:
            stages.add(stage)
    if not bases and not stages:
        raise InvalidArgument("environment/Dockerfile has no FROM line", details={"field": "environment/Dockerfile"})
    return bases


def _has_image(client: Any, name: str) -> bool:
    try:
        client.images.get(name)
    except docker.errors.ImageNotFound:
        return False
    return True


def _check_workdir(workdir: str) -> str:
    """The image's ``WORKDIR``, normalised, when it can become the workspace symlink."""
    normal = os.path.normpath(workdir or "/")
    nested = normal.startswith(("/polar/", "/logs/", "/tests/", "/proc/", "/sys/", "/dev/"))
    if not normal.startswith("/") or normal in _SYSTEM_DIRS or nested or not _SAFE_PATH.match(normal):
        raise InvalidArgument(
            f"environment/Dockerfile: WORKDIR {workdir or '/'!r} cannot be the agent's workspace; set WORKDIR to a "
            "directory of its own (Harbor tasks use /app)",
            details={"field": "environment/Dockerfile WORKDIR"},
        )
    return normal


def _build(client: Any, timeout_s: float, **kwargs: Any) -> None:
    """Run one offline build; the build's own failure is the task's (``InvalidArgument``)."""
    try:
        client.images.build(pull=False, network_mode="none", rm=True, forcerm=True, timeout=int(timeout_s), **kwargs)
    except docker.errors.BuildError as exc:
        tail = "".join(str(chunk.get("stream") or chunk.get("error") or "") for chunk in exc.build_log)[-1500:]
        raise InvalidArgument(f"building environment/Dockerfile failed: {exc.msg}\n{tail}",
                              details={"field": "environment/Dockerfile"}) from None  # fmt: skip
    except docker.errors.APIError as exc:
        raise InvalidArgument(f"building environment/Dockerfile failed: {exc}",
                              details={"field": "environment/Dockerfile"}) from None  # fmt: skip


def _extract_workdir(client: Any, image: str, workdir: str, target: Path) -> None:
    """Copy ``workdir`` out of ``image`` into ``target`` (tar ``data`` filter: no links out, no devices, no owners)."""
    container = client.containers.create(image, command=["true"], network_disabled=True)
    try:
        stream, _ = container.get_archive(workdir)
        with tempfile.TemporaryDirectory(prefix="polar-harbor-", dir=target.parent) as tmp:
            archive = Path(tmp) / "workdir.tar"
            with archive.open("wb") as fh:
                for chunk in stream:
                    fh.write(chunk)
            out = Path(tmp) / "out"
            out.mkdir()
            try:
                with tarfile.open(archive) as tar:
                    tar.extractall(out, filter="data")
            except (tarfile.TarError, OSError) as exc:  # a link out of WORKDIR, a device file, ...
                raise InvalidArgument(f"environment/Dockerfile: WORKDIR {workdir} cannot be copied out: {exc}",
                                      details={"field": "environment/Dockerfile WORKDIR"}) from None  # fmt: skip
            inner = out / PurePosixPath(workdir).name
            if not inner.is_dir():
                raise InvalidArgument(f"environment/Dockerfile: WORKDIR {workdir} is not a directory in the image",
                                      details={"field": "environment/Dockerfile WORKDIR"})  # fmt: skip
            shutil.rmtree(target, ignore_errors=True)
            inner.rename(target)
    finally:
        with contextlib.suppress(docker.errors.DockerException):
            container.remove(force=True)


def _polar_layer(base: str, workdir: str, root: str, content_hash: str) -> bytes:
    parent = str(PurePosixPath(workdir).parent)
    lines = [
        f"FROM {base}",
        "USER root",
        f"RUN rm -rf {workdir} /logs /tests && mkdir -p {parent} && ln -s {root}/workspace {workdir} "
        f"&& ln -s {root}/logs /logs && ln -s {root}/tests /tests",
        f'LABEL polar.harbor.workdir="{workdir}" polar.harbor.hash="{content_hash}"',
        f"WORKDIR {workdir}",
    ]
    return ("\n".join(lines) + "\n").encode("utf-8")


def build_environment(
    env_dir: Path,
    *,
    name: str,
    out_dir: Path,
    docker_image: str = "",
    docker_host: str = "",
    client: Any | None = None,
    container_root: str = DEFAULT_CONTAINER_ROOT,
    timeout_s: float = 600.0,
    build_missing_image: bool = False,
) -> BuiltEnvironment:
    """Build (or find) the environment's runtime image and its workspace base; see the module docstring.

    Args:
        env_dir: The build context (the task's ``environment/``).
        name: The task's name (part of the tags).
        out_dir: Host directory for the workspace bases (``<out_dir>/<hash>/workdir``).
        docker_image: A prebuilt image to use instead of the Dockerfile (Harbor's ``environment.docker_image``).
        docker_host: The daemon's URL; empty: the Docker SDK's environment defaults (``DOCKER_HOST``).
        client: A ``docker.DockerClient`` to use instead.
        container_root: The runtimes' session directory inside containers.
        timeout_s: Build timeout (Harbor's ``environment.build_timeout_sec``).
        build_missing_image: When ``docker_image`` is not on the daemon, build ``env_dir``'s Dockerfile instead
            (the operator's opt-in; logged). Without it such a task is refused, naming the opt-in.

    Raises:
        InvalidArgument: No Dockerfile, a ``docker_image`` or base image not present (nothing is pulled), a failed
            build, or an unusable ``WORKDIR`` (the message names the field).
        FailedPrecondition: No Docker daemon can be reached.
    """
    try:
        docker_client = client or (docker.DockerClient(base_url=docker_host) if docker_host else docker.from_env())
        docker_client.ping()
    except docker.errors.DockerException as exc:
        raise FailedPrecondition(f"Harbor tasks need a Docker daemon to build their environment: {exc}") from None
    if docker_image and not _has_image(docker_client, docker_image):
        docker_image = _instead_of_missing(env_dir, name, docker_image, allowed=build_missing_image)
    content = context_hash(env_dir, docker_image=docker_image, container_root=container_root)
    base_tag, tag = image_tags(name, content)
    target = out_dir / content[:16]
    marker = target / _MARKER
    if marker.is_file() and _has_image(docker_client, tag):
        recorded = json.loads(marker.read_text(encoding="utf-8"))
        return BuiltEnvironment(tag, str(recorded["workdir"]), target / "workdir", content)
    base = _base_image(docker_client, env_dir, docker_image, base_tag, timeout_s)
    workdir = _check_workdir(str(docker_client.images.get(base).attrs.get("Config", {}).get("WorkingDir") or ""))
    target.mkdir(parents=True, exist_ok=True)
    _extract_workdir(docker_client, base, workdir, target / "workdir")
    layer = _polar_layer(base, workdir, container_root, content)
    _build(docker_client, timeout_s, fileobj=io.BytesIO(layer), tag=tag)
    marker.write_text(json.dumps({"image": tag, "workdir": workdir, "base": base}), encoding="utf-8")
    return BuiltEnvironment(tag, workdir, target / "workdir", content)


def _instead_of_missing(env_dir: Path, name: str, docker_image: str, *, allowed: bool) -> str:
    """``""`` (build the Dockerfile) for a ``docker_image`` that is not on the daemon, when the operator allows it.

    The image is then exactly what a task with only this Dockerfile gets (same content hash, same tags).

    Raises:
        InvalidArgument: Not allowed (the message names the opt-in), or no Dockerfile to build instead.
    """
    field = {"field": "environment.docker_image"}
    if not allowed:
        raise InvalidArgument(
            f"environment.docker_image {docker_image!r} is not on the Docker host, and Polar never pulls images: load "
            f"it there, or let Polar build the task's environment/Dockerfile instead ({BUILD_MISSING_HOW})",
            details=field,
        )
    if not (env_dir / "Dockerfile").is_file():
        raise InvalidArgument(
            f"environment.docker_image {docker_image!r} is not on the Docker host, and the task has no "
            "environment/Dockerfile to build instead",
            details=field,
        )
    _log.warning(
        "Harbor task %s: environment.docker_image %r is not on the Docker host; using its environment/Dockerfile "
        "instead, built offline (build missing images is on)",
        name,
        docker_image,
    )
    return ""


def _base_image(client: Any, env_dir: Path, docker_image: str, base_tag: str, timeout_s: float) -> str:
    """The task's own image: ``docker_image`` when named (it must be present), else its Dockerfile built offline."""
    if docker_image:
        if not _has_image(client, docker_image):
            raise InvalidArgument(
                f"environment.docker_image {docker_image!r} is not on the Docker host, and Polar never pulls images",
                details={"field": "environment.docker_image"},
            )
        return docker_image
    dockerfile = env_dir / "Dockerfile"
    if not dockerfile.is_file():
        raise InvalidArgument(f"{env_dir}: the task has no environment/Dockerfile (and no environment.docker_image)",
                              details={"field": "environment/Dockerfile"})  # fmt: skip
    if _has_image(client, base_tag):
        return base_tag
    for image in dockerfile_bases(dockerfile.read_text(encoding="utf-8")):
        if not _has_image(client, image):
            raise InvalidArgument(
                f"environment/Dockerfile: FROM {image} is not on the Docker host and Polar builds offline (nothing is "
                "pulled); load or build that image there first",
                details={"field": "environment/Dockerfile FROM"},
            )
    _build(client, timeout_s, path=str(env_dir), tag=base_tag)
    return base_tag
