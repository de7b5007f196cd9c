"""The evaluator as one object: the evaluation service and the runtimes it holds, built from the settings."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider

from evaluator.core import EvaluatorService
from evaluator.metrics import EvaluatorMetrics
from evaluator.models import EvaluatorConfig
from evaluator.ports import RuntimeFactory
from evaluator.settings import EvaluatorSettings
from polar_core.metrics import MetricsEndpoint, open_endpoint
from runtimes import Isolation
from runtimes.local import IsolationProbe, probe_isolation

__all__ = ["EvaluatorApp", "evaluator_config"]

_log = logging.getLogger(__name__)


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
        min_isolation=settings.min_isolation,
        read_only_roots=tuple(Path(p) for p in settings.read_only_roots),
        allowed_images=tuple(settings.allowed_images),
        task_roots=tuple(Path(p).absolute() for p in settings.task_roots) or (Path.cwd().absolute(),),
        disk_limit=settings.disk_limit,
    )


class EvaluatorApp:
    """The evaluation service of one evaluator process; closing it releases every runtime still held.

    Attributes:
        service: The domain service the servicer delegates to.
        metrics_port: Port of the Prometheus endpoint (-1 when off).
    """

    def __init__(self, service: EvaluatorService, *, metrics_endpoint: MetricsEndpoint | None = None) -> None:
        self.service = service
        self._endpoint = metrics_endpoint
        self.metrics_port = metrics_endpoint.port if metrics_endpoint is not None else -1

    @classmethod
    async def open(
        cls,
        settings: EvaluatorSettings,
        *,
        tracer_provider: TracerProvider | None = None,
        runtime_factory: RuntimeFactory | None = None,
        isolation: IsolationProbe | None = None,
    ) -> EvaluatorApp:
        """Build the evaluator from its settings.

        Args:
            settings: The evaluator's settings.
            tracer_provider: Accepted for the common shape; the evaluator makes no client spans.
            runtime_factory: Builds runtimes; default: local/docker/apptainer from the spec.
            isolation: The host's isolation probe (tests); by default probed here, once, when the local
                isolation is ``auto`` and no factory replaces the runtimes.
        """
        del tracer_provider
        config = evaluator_config(settings)
        if settings.local_isolation == "auto" and (runtime_factory is None or isolation is not None):
            probe = isolation or await probe_isolation(Isolation(settings.min_isolation))
            shortfall = probe.shortfall(Isolation(settings.min_isolation))
            if shortfall is not None:
                _log.error("evaluator refuses evaluations in a local runtime: %s", shortfall)
            else:
                # Probed once: every local runtime uses the strongest level this host provides.
                config = dataclasses.replace(config, local_isolation=probe.best.value)
        if Isolation(settings.min_isolation).rank < Isolation.BWRAP.rank:
            _log.warning("evaluator allows weak local isolation (min_isolation=%s)", settings.min_isolation)
        endpoint, provider = open_endpoint(
            "polar-evaluator", settings.metrics_host, settings.metrics_port, token=settings.metrics_token
        )
        metrics = EvaluatorMetrics(provider)
        return cls(
            EvaluatorService(config, runtime_factory=runtime_factory, metrics=metrics), metrics_endpoint=endpoint
        )

    async def close(self) -> None:
        """Release every live evaluation handle and its runtime, then stop the metrics endpoint."""
        await self.service.close()
        endpoint, self._endpoint = self._endpoint, None
        if endpoint is not None:
            endpoint.stop()
