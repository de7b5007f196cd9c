"""The evaluator as one object: the evaluation service and the runtimes it holds, built from the settings."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider

from evaluator.core import EvaluatorService
from evaluator.models import EvaluatorConfig
from evaluator.ports import RuntimeFactory
from evaluator.settings import EvaluatorSettings

__all__ = ["EvaluatorApp", "evaluator_config"]


def evaluator_config(settings: EvaluatorSettings) -> EvaluatorConfig:
    """The typed config the evaluation service takes, from the evaluator's settings."""
    return EvaluatorConfig(
        evaluations_dir=settings.evaluations_dir,
        runtimes_dir=settings.runtimes_dir,
        default_timeout_s=settings.default_timeout_s,
        prepare_timeout_s=settings.prepare_timeout_s,
        local_isolation=settings.local_isolation,
        local_python=settings.local_python,
        container_python=settings.container_python,
        docker_host=settings.docker_host,
        docker_memory_limit=settings.docker_memory_limit,
        docker_pids_limit=settings.docker_pids_limit,
        max_patch_bytes=settings.max_patch_bytes,
    )


class EvaluatorApp:
    """The evaluation service of one evaluator process; closing it releases every runtime still held.

    Attributes:
        service: The domain service the servicer delegates to.
    """

    def __init__(self, service: EvaluatorService) -> None:
        self.service = service

    @classmethod
    async def open(
        cls,
        settings: EvaluatorSettings,
        *,
        tracer_provider: TracerProvider | None = None,
        runtime_factory: RuntimeFactory | None = None,
    ) -> EvaluatorApp:
        """Build the evaluator from its settings.

        Args:
            settings: The evaluator's settings.
            tracer_provider: Accepted for the common shape; the evaluator makes no client spans.
            runtime_factory: Builds runtimes; default: local/docker/apptainer from the spec.
        """
        del tracer_provider
        return cls(EvaluatorService(evaluator_config(settings), runtime_factory=runtime_factory))

    async def close(self) -> None:
        """Release every live evaluation handle and its runtime."""
        await self.service.close()
