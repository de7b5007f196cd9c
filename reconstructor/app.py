"""The reconstructor service as one object: its defaults and the proxy client, built from the settings."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider

from polar_core.roles import Role
from reconstructor.eot import end_of_turn_ids_from_tokenizer
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
    """

    def __init__(self, defaults: ServiceDefaults, completion_source: CompletionSource) -> None:
        self.defaults = defaults
        self.completion_source = completion_source

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
        return cls(service_defaults(settings), source)

    async def close(self) -> None:
        """Nothing to release: the proxy client opens a channel per request and closes it."""
