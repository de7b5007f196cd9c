"""Build runtimes from specs."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Protocol

from runtimes.base import Runtime
from runtimes.spec import RuntimeKind, RuntimeSpec

__all__ = ["DefaultRuntimeFactory", "RuntimeFactory", "create_runtime"]


class RuntimeFactory(Protocol):
    """Creates (unstarted) runtimes; the seam where tests substitute fakes."""

    def create(self, spec: RuntimeSpec, *, session_id: str) -> Runtime:
        """Return an unstarted runtime for ``session_id``."""
        ...


def create_runtime(spec: RuntimeSpec, *, session_id: str, base_dir: Path, docker_client: Any | None = None) -> Runtime:
    """Return an unstarted runtime of ``spec.kind``.

    Args:
        spec: What to build.
        session_id: The session (names the directory or container).
        base_dir: Parent of host session directories (local, apptainer).
        docker_client: A shared ``docker.DockerClient``; built from ``spec.docker_host`` when omitted.
    """
    if spec.kind is RuntimeKind.LOCAL:
        from runtimes.local import LocalRuntime

        return LocalRuntime(spec, session_id=session_id, base_dir=base_dir)
    if spec.kind is RuntimeKind.DOCKER:
        # Imported lazily so the docker SDK is needed only by those who use Docker.
        from runtimes.docker import DockerRuntime

        return DockerRuntime(spec, session_id=session_id, client=docker_client)
    from runtimes.apptainer import ApptainerRuntime

    return ApptainerRuntime(spec, session_id=session_id, base_dir=base_dir)


@dataclasses.dataclass
class DefaultRuntimeFactory:
    """A :class:`RuntimeFactory` over :func:`create_runtime`, sharing one Docker client.

    Attributes:
        base_dir: Parent of host session directories.
        docker_client: Shared Docker client, created on first use from the spec's ``docker_host``.
    """

    base_dir: Path
    docker_client: Any | None = None

    def create(self, spec: RuntimeSpec, *, session_id: str) -> Runtime:
        """Return an unstarted runtime for ``session_id``."""
        return create_runtime(spec, session_id=session_id, base_dir=self.base_dir, docker_client=self.docker_client)
