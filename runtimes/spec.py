"""The runtime part of a task file (``runtime: {kind: local|docker|apptainer, image?, ...}``) as a dataclass."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from polar_core.errors import InvalidArgument
from runtimes._limits import parse_size

__all__ = ["Isolation", "NetworkMode", "RuntimeKind", "RuntimeSpec"]


class RuntimeKind(enum.StrEnum):
    """Which runtime implementation to use."""

    LOCAL = "local"
    DOCKER = "docker"
    APPTAINER = "apptainer"

    @property
    def runs_image(self) -> bool:
        """Whether this kind runs a container image: ``image`` is required, and the operator's image patterns and
        the task's own container kind apply to it (``runtimes.sandbox_policy``)."""
        return self in _IMAGE_KINDS


_IMAGE_KINDS = frozenset({RuntimeKind.DOCKER, RuntimeKind.APPTAINER})


class NetworkMode(enum.StrEnum):
    """What a sandbox can reach.

    ``none``: loopback only (its own). ``host``: the host's network. ``proxy``: loopback only, plus the
    model proxy, reached through a Unix socket that is mounted into the sandbox and exposed there on
    ``127.0.0.1:<proxy_port>`` (see docs/runtimes.md).
    """

    NONE = "none"
    HOST = "host"
    PROXY = "proxy"


class Isolation(enum.StrEnum):
    """How the local runtime isolates commands; ``auto`` picks the strongest namespace level that works here.

    ``gvisor`` (a user-space kernel, :mod:`runtimes.gvisor`) ranks above ``bwrap``; ``auto`` picks it only where
    ``min_isolation`` asks for it.
    """

    AUTO = "auto"
    GVISOR = "gvisor"
    BWRAP = "bwrap"
    UNSHARE = "unshare"
    NONE = "none"

    @property
    def rank(self) -> int:
        """Strength of an explicit level (``none`` 0, ``unshare`` 1, ``bwrap`` 2, ``gvisor`` 3); ``auto`` ranks as
        ``none``."""
        return _ISOLATION_RANK[self]


_ISOLATION_RANK = {Isolation.AUTO: 0, Isolation.NONE: 0, Isolation.UNSHARE: 1, Isolation.BWRAP: 2, Isolation.GVISOR: 3}


@dataclasses.dataclass(frozen=True, slots=True)
class RuntimeSpec:
    """How to build a runtime.

    Attributes:
        kind: The implementation.
        image: Container image (docker) or image file / URI (apptainer); unused by local.
        network: What the sandbox can reach.
        proxy_socket: Host path of the model proxy's Unix socket, for ``network: proxy``.
        proxy_port: Loopback port inside the sandbox that forwards to ``proxy_socket``.
        memory_limit: Memory limit (docker syntax, ``"4g"``): of a container; of the local sandbox's cgroup
            where one can be made, and of every local process's data size (``RLIMIT_DATA``) always.
        pids_limit: Maximum number of processes in a container or local sandbox (pids cgroup, else
            ``RLIMIT_NPROC``).
        cpus: CPU limit of a container; ``None`` for none (not enforced by the local runtime).
        cpu_time_limit_s: CPU seconds each local process may use (``RLIMIT_CPU``); ``None`` for none.
        file_size_limit: Largest file a local process may write (``RLIMIT_FSIZE``, docker syntax).
        tmp_size: Size of the container's ``/tmp`` tmpfs (docker, with ``read_only_root``) and of the local
            bubblewrap sandbox's ``/tmp``.
        sandbox_uid: The uid commands run as: inside bubblewrap when the runtime runs as root, and in a
            container.
        sandbox_gid: The matching gid.
        read_only_root: Docker: a read-only root file system, with tmpfs ``/tmp`` and the session directory
            on a volume (turn off for images that must write elsewhere).
        isolation: Local runtime isolation.
        min_isolation: The weakest isolation the local runtime may use: with ``isolation: auto`` it refuses to
            start (``FailedPrecondition``) when this host offers nothing at least as strong. Set by the
            operator's policy (:mod:`runtimes.sandbox_policy`); a bare spec allows anything.
        read_only_paths: Extra host paths the sandbox may read, at the same path inside: bound read-only by the
            local bubblewrap sandbox (which always adds the Python in use and its prefix) and mounted
            read-only into a Docker container (e.g. installed harness CLIs and ``node``).
        env: Extra environment for every command.
        docker_host: Docker daemon URL (``unix:///...``); ``None`` uses the SDK's environment defaults.
        container_root: The session directory's path inside a container.
        disk_limit: The workspace disk quota (docker syntax): what the session directory (local) or session
            volume (docker) may allocate while commands run (:mod:`runtimes._quota`); ``None`` for none.
    """

    kind: RuntimeKind = RuntimeKind.LOCAL
    image: str = ""
    network: NetworkMode = NetworkMode.NONE
    proxy_socket: Path | None = None
    proxy_port: int = 18080
    memory_limit: str = "4g"
    pids_limit: int = 1024
    cpus: float | None = None
    cpu_time_limit_s: int | None = 7200
    file_size_limit: str = "1g"
    tmp_size: str = "512m"
    sandbox_uid: int = 65534
    sandbox_gid: int = 65534
    read_only_root: bool = True
    isolation: Isolation = Isolation.AUTO
    min_isolation: Isolation = Isolation.NONE
    read_only_paths: tuple[Path, ...] = ()
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    docker_host: str | None = None
    container_root: str = "/polar/session"
    disk_limit: str | None = "4g"

    def __post_init__(self) -> None:
        if self.kind.runs_image and not self.image:
            raise InvalidArgument(f"runtime kind {self.kind.value!r} needs an image")
        if self.network is NetworkMode.PROXY and self.proxy_socket is None:
            raise InvalidArgument("network 'proxy' needs proxy_socket")
        for name in ("memory_limit", "file_size_limit", "tmp_size", "disk_limit"):
            if getattr(self, name) is None and name == "disk_limit":
                continue
            try:
                parse_size(getattr(self, name))
            except ValueError:
                raise InvalidArgument(f"runtime option {name} is not a size: {getattr(self, name)!r}") from None
        if self.min_isolation is Isolation.AUTO:
            raise InvalidArgument("min_isolation must be gvisor, bwrap, unshare or none")
        if self.isolation is not Isolation.AUTO and self.isolation.rank < self.min_isolation.rank:
            raise InvalidArgument(
                f"isolation {self.isolation.value!r} is weaker than the minimum {self.min_isolation.value!r}"
            )
        if self.pids_limit < 1 or (self.cpu_time_limit_s is not None and self.cpu_time_limit_s < 1):
            raise InvalidArgument("runtime limits must be positive")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], **defaults: Any) -> RuntimeSpec:
        """Build a spec from a task file's ``runtime`` table; ``defaults`` fill keys the table leaves out.

        Raises:
            InvalidArgument: An unknown key or value.
        """
        merged: dict[str, Any] = {**defaults, **dict(data)}
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(merged) - names)
        if unknown:
            raise InvalidArgument(f"unknown runtime option(s): {', '.join(unknown)}")
        try:
            if "kind" in merged:
                merged["kind"] = RuntimeKind(merged["kind"])
            if "network" in merged:
                merged["network"] = NetworkMode(merged["network"])
            for key in ("isolation", "min_isolation"):
                if key in merged:
                    merged[key] = Isolation(merged[key])
            if merged.get("proxy_socket") is not None:
                merged["proxy_socket"] = Path(merged["proxy_socket"])
            if "read_only_paths" in merged:
                merged["read_only_paths"] = tuple(Path(p) for p in merged["read_only_paths"])
            for key in ("proxy_port", "pids_limit", "cpu_time_limit_s", "sandbox_uid", "sandbox_gid"):
                # Task files arrive as JSON (protobuf Struct): integers come as floats.
                if isinstance(merged.get(key), float) and float(merged[key]).is_integer():
                    merged[key] = int(merged[key])
            if "env" in merged:
                merged["env"] = {str(k): str(v) for k, v in dict(merged["env"]).items()}
            return cls(**merged)
        except (ValueError, TypeError) as exc:
            raise InvalidArgument(f"invalid runtime option: {exc}") from None
