"""Evaluator settings (``POLAR_EVALUATOR_*`` environment variables, ``[evaluator]`` TOML table)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from polar_core.errors import InvalidArgument
from polar_core.settings import ServiceSettings
from runtimes import RuntimeSpec

__all__ = ["EvaluatorSettings"]


class EvaluatorSettings(ServiceSettings):
    """Settings of the evaluator service.

    Attributes:
        default_timeout_s: Evaluation time limit when neither the request nor the task sets one.
        prepare_timeout_s: Time limit of Prepare (runtime start and repository snapshot).
        runtime_dir: Parent of local session directories; default ``<state_dir>/runtimes``.
        local_isolation: Local runtime isolation: ``auto``, ``bwrap``, ``unshare`` or ``none``.
        local_python: The Python that runs tests in the local runtime (needs pytest); default: this one.
        container_python: The Python command inside container images.
        docker_host: Docker daemon URL; empty uses the Docker SDK's defaults.
        docker_memory_limit: Memory limit of evaluation containers.
        docker_pids_limit: Process limit of evaluation containers.
        max_patch_bytes: The largest patch evaluated (default 64 MiB, the gateway's limit); a larger one is
            ``invalid_patch`` with the sizes in its message.
        min_isolation: The weakest local isolation allowed: ``bwrap`` (default); ``unshare`` or ``none`` only when
            set explicitly (every evaluation then logs a WARNING). Probed once at start; a host below it logs an
            ERROR and refuses every evaluation that needs a local runtime with FAILED_PRECONDITION.
        task_roots: Host directories a task's ``repo``, ``repo_path`` and ``test_patch`` paths must resolve
            under (after symlinks); empty means the working directory at start.
        read_only_roots: Host directories under which a task's ``runtime.read_only_paths`` may lie; empty allows
            none.
        allowed_images: Glob patterns of container images a task may name; empty allows none.
        disk_limit: The workspace disk quota of every evaluation runtime (docker size syntax, default ``4g``; empty
            for none; a task's ``runtime.disk_limit`` may only lower it). Tests under evaluation that outgrow it
            are killed and the evaluation is ``unresolved`` with the quota in its message.
    """

    model_config = SettingsConfigDict(env_prefix="POLAR_EVALUATOR_", frozen=True, extra="forbid")
    toml_table: ClassVar[str] = "evaluator"

    default_timeout_s: float = Field(default=1800.0, gt=0)
    prepare_timeout_s: float = Field(default=600.0, gt=0)
    runtime_dir: Path | None = None
    local_isolation: str = "auto"
    local_python: str = sys.executable
    container_python: str = "python3"
    docker_host: str = ""
    docker_memory_limit: str = "4g"
    docker_pids_limit: int = 1024
    max_patch_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    min_isolation: Literal["gvisor", "bwrap", "unshare", "none"] = "bwrap"
    task_roots: list[str] = Field(default_factory=list)
    read_only_roots: list[str] = Field(default_factory=list)
    allowed_images: list[str] = Field(default_factory=list)
    disk_limit: str | None = "4g"

    @field_validator("disk_limit")
    @classmethod
    def _check_disk_limit(cls, value: str | None) -> str | None:
        if not value:
            return None
        try:
            RuntimeSpec(disk_limit=value)
        except InvalidArgument as exc:
            raise ValueError(exc.message) from None
        return value

    @property
    def evaluations_dir(self) -> Path:
        """Where results and logs of evaluations are kept."""
        return self.state_dir / "evaluations"

    @property
    def runtimes_dir(self) -> Path:
        """Parent of local session directories."""
        return self.runtime_dir or self.state_dir / "runtimes"
