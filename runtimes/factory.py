"""Build runtimes from specs: :data:`RUNTIMES` registers a builder per :class:`~runtimes.spec.RuntimeKind`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from polar_core.registry import Registry
from runtimes.base import Runtime
from runtimes.spec import Isolation, RuntimeKind, RuntimeSpec

if TYPE_CHECKING:
    from runtimes.local import LocalHost

__all__ = ["RUNTIMES", "DefaultRuntimeFactory", "RuntimeBuilder", "RuntimeFactory", "create_runtime"]


class RuntimeFactory(Protocol):
    """Creates (unstarted) runtimes; the seam where tests substitute fakes."""

    def create(self, spec: RuntimeSpec, *, session_id: str) -> Runtime:
        """Return an unstarted runtime for ``session_id``."""
        ...


class RuntimeBuilder(Protocol):
    """Builds an unstarted runtime of one kind (see :func:`create_runtime` for the arguments)."""

    def __call__(
        self,
        spec: RuntimeSpec,
        *,
        session_id: str,
        base_dir: Path,
        docker_client: Any | None,
        local_host: LocalHost | None,
    ) -> Runtime:
        """Return an unstarted runtime for ``session_id``."""
        ...


# Each builder imports its implementation when called, so the docker SDK is needed only by those who use Docker.


def _local(
    spec: RuntimeSpec, *, session_id: str, base_dir: Path, docker_client: Any | None, local_host: LocalHost | None
) -> Runtime:
    if Isolation.GVISOR in (spec.isolation, spec.min_isolation):
        from runtimes.gvisor import GVisorRuntime

        return GVisorRuntime(spec, session_id=session_id, base_dir=base_dir)
    from runtimes.local import LocalRuntime

    return LocalRuntime(spec, session_id=session_id, base_dir=base_dir, host=local_host)


def _docker(
    spec: RuntimeSpec, *, session_id: str, base_dir: Path, docker_client: Any | None, local_host: LocalHost | None
) -> Runtime:
    from runtimes._diskimage import IMAGE_DIR_NAME
    from runtimes.docker import DockerRuntime

    return DockerRuntime(spec, session_id=session_id, client=docker_client, disk_dir=base_dir / IMAGE_DIR_NAME)


def _apptainer(
    spec: RuntimeSpec, *, session_id: str, base_dir: Path, docker_client: Any | None, local_host: LocalHost | None
) -> Runtime:
    from runtimes.apptainer import ApptainerRuntime

    return ApptainerRuntime(spec, session_id=session_id, base_dir=base_dir)


RUNTIMES: Registry[RuntimeBuilder] = Registry(
    "runtime kind",
    [
        (RuntimeKind.LOCAL.value, _local),
        (RuntimeKind.DOCKER.value, _docker),
        (RuntimeKind.APPTAINER.value, _apptainer),
    ],
)
"""``runtime.kind`` (a :class:`~runtimes.spec.RuntimeKind` value) → the builder of that runtime."""


def create_runtime(
    spec: RuntimeSpec,
    *,
    session_id: str,
    base_dir: Path,
    docker_client: Any | None = None,
    local_host: LocalHost | None = None,
) -> Runtime:
    """Return an unstarted runtime of ``spec.kind``.

    Args:
        spec: What to build.
        session_id: The session (names the directory or container).
        base_dir: Parent of host session directories (local, apptainer).
        docker_client: A shared ``docker.DockerClient``; built from ``spec.docker_host`` when omitted.
        local_host: What local runtimes share about this host (each probes for itself when omitted).
    """
    build = RUNTIMES.get_or_raise(spec.kind.value)
    return build(spec, session_id=session_id, base_dir=base_dir, docker_client=docker_client, local_host=local_host)


@dataclasses.dataclass
class DefaultRuntimeFactory:
    """A :class:`RuntimeFactory` over :func:`create_runtime`, sharing one Docker client and one local host probe.

    Attributes:
        base_dir: Parent of host session directories.
        docker_client: Shared Docker client, created on first use from the spec's ``docker_host``.
    """

    base_dir: Path
    docker_client: Any | None = None
    # What the local runtimes learn about this host (bubblewrap's flags; limits logged once), made on first use.
    _local_host: LocalHost | None = dataclasses.field(default=None, init=False, repr=False)

    def create(self, spec: RuntimeSpec, *, session_id: str) -> Runtime:
        """Return an unstarted runtime for ``session_id``."""
        if spec.kind is RuntimeKind.LOCAL and self._local_host is None:
            from runtimes.local import LocalHost

            self._local_host = LocalHost()
        return create_runtime(
            spec,
            session_id=session_id,
            base_dir=self.base_dir,
            docker_client=self.docker_client,
            local_host=self._local_host,
        )
