"""The runtime part of a task file (``runtime: {kind: local|docker|apptainer, image?, ...}``) as a dataclass."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from polar_core.errors import InvalidArgument

__all__ = ["Isolation", "NetworkMode", "RuntimeKind", "RuntimeSpec"]


class RuntimeKind(enum.StrEnum):
    """Which runtime implementation to use."""

    LOCAL = "local"
    DOCKER = "docker"
    APPTAINER = "apptainer"


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
    """How the local runtime isolates commands; ``auto`` picks the strongest that works here."""

    AUTO = "auto"
    BWRAP = "bwrap"
    UNSHARE = "unshare"
    NONE = "none"


@dataclasses.dataclass(frozen=True, slots=True)
class RuntimeSpec:
    """How to build a runtime.

    Attributes:
        kind: The implementation.
        image: Container image (docker) or image file / URI (apptainer); unused by local.
        network: What the sandbox can reach.
        proxy_socket: Host path of the model proxy's Unix socket, for ``network: proxy``.
        proxy_port: Loopback port inside the sandbox that forwards to ``proxy_socket``.
        memory_limit: Container memory limit (docker syntax, ``"4g"``).
        pids_limit: Maximum number of processes in a container.
        cpus: CPU limit of a container; ``None`` for none.
        isolation: Local runtime isolation.
        read_only_paths: Extra host paths the sandbox may read, at the same path inside: bound read-only by the
            local bubblewrap sandbox (which always adds the Python in use and its prefix) and mounted
            read-only into a Docker container (e.g. installed harness CLIs and ``node``).
        env: Extra environment for every command.
        docker_host: Docker daemon URL (``unix:///...``); ``None`` uses the SDK's environment defaults.
        container_root: The session directory's path inside a container.
    """

    kind: RuntimeKind = RuntimeKind.LOCAL
    image: str = ""
    network: NetworkMode = NetworkMode.NONE
    proxy_socket: Path | None = None
    proxy_port: int = 18080
    memory_limit: str = "4g"
    pids_limit: int = 1024
    cpus: float | None = None
    isolation: Isolation = Isolation.AUTO
    read_only_paths: tuple[Path, ...] = ()
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    docker_host: str | None = None
    container_root: str = "/polar/session"

    def __post_init__(self) -> None:
        if self.kind in (RuntimeKind.DOCKER, RuntimeKind.APPTAINER) and not self.image:
            raise InvalidArgument(f"runtime kind {self.kind.value!r} needs an image")
        if self.network is NetworkMode.PROXY and self.proxy_socket is None:
            raise InvalidArgument("network 'proxy' needs proxy_socket")

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
            if "isolation" in merged:
                merged["isolation"] = Isolation(merged["isolation"])
            if merged.get("proxy_socket") is not None:
                merged["proxy_socket"] = Path(merged["proxy_socket"])
            if "read_only_paths" in merged:
                merged["read_only_paths"] = tuple(Path(p) for p in merged["read_only_paths"])
            for key in ("proxy_port", "pids_limit"):
                # Task files arrive as JSON (protobuf Struct): integers come as floats.
                if isinstance(merged.get(key), float) and float(merged[key]).is_integer():
                    merged[key] = int(merged[key])
            if "env" in merged:
                merged["env"] = {str(k): str(v) for k, v in dict(merged["env"]).items()}
            return cls(**merged)
        except (ValueError, TypeError) as exc:
            raise InvalidArgument(f"invalid runtime option: {exc}") from None
