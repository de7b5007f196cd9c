"""The reconstructor service as one object: its defaults and the proxy client, built from the settings."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider

from polar_core.metrics import MetricsEndpoint, open_endpoint
from polar_core.roles import Role
from reconstructor.eot import end_of_turn_ids_from_tokenizer
from reconstructor.metrics import ReconstructorMetrics
from reconstructor.models import ServiceDefaults
from reconstructor.ports import CompletionSource
from reconstructor.proxy_source import ProxyCompletionSource
from reconstructor.settings import ReconstructorSettings

__all__ = ["ReconstructorApp", "service_defaults"]


def service_defaults(settings: ReconstructorSettings) -> ServiceDefaults:
    """The defaults for unspecified request fields; the tokenizer directory is read here, once."""
    end_of_turn_ids = settings.end_of_turn_ids or (
        end_of_turn_ids_from_tokenizer(settings.tokenizer_dir) if settings.tokenizer_dir else ()
    )
    return ServiceDefaults(
        strategy=settings.default_strategy,
        end_of_turn_ids=tuple(end_of_turn_ids),
        weighting=settings.default_weighting,
        split_on_policy_version=settings.split_on_policy_version,
        prefer_exact_context=settings.prefer_exact_context,
    )


class ReconstructorApp:
    """What the servicer needs: the request defaults and where proxy-named completions are read.

    Attributes:
        defaults: What unspecified request fields become.
        completion_source: Reads the completions a ``ProxySource`` names.
        metrics: Where reconstructions are counted.
        metrics_port: Port of the Prometheus endpoint (-1 when off).
    """

    def __init__(
        self,
        defaults: ServiceDefaults,
        completion_source: CompletionSource,
        *,
        metrics_endpoint: MetricsEndpoint | None = None,
    ) -> None:
        self.defaults = defaults
        self.completion_source = completion_source
        self._endpoint = metrics_endpoint
        self.metrics = ReconstructorMetrics(metrics_endpoint.meter_provider if metrics_endpoint else None)
        self.metrics_port = metrics_endpoint.port if metrics_endpoint is not None else -1

    @classmethod
    async def open(
        cls,
        settings: ReconstructorSettings,
        *,
        tracer_provider: TracerProvider | None = None,
        completion_source: CompletionSource | None = None,
    ) -> ReconstructorApp:
        """Build the reconstructor from its settings.

        Args:
            settings: The reconstructor's settings.
            tracer_provider: Provider for the proxy client's spans.
            completion_source: Replaces the real :class:`ProxyCompletionSource` (tests).
        """
        source = completion_source or ProxyCompletionSource(
            page_size=settings.proxy_page_size,
            timeout_s=settings.proxy_timeout_s,
            auth_token=settings.presented_token(Role.INTERNAL),
            tracer_provider=tracer_provider,
            tls=settings.tls(),
            max_message_bytes=settings.max_message_bytes,
        )
        endpoint, _provider = open_endpoint(
            "polar-reconstructor", settings.metrics_host, settings.metrics_port, token=settings.metrics_token
        )
        return cls(service_defaults(settings), source, metrics_endpoint=endpoint)

    async def close(self) -> None:
        """Stop the metrics endpoint (the proxy client opens a channel per request and closes it)."""
        endpoint, self._endpoint = self._endpoint, None
        if endpoint is not None:
            endpoint.stop()
