"""Provider protocol adapters, one folder per protocol, and :data:`PROTOCOLS`, the registry the HTTP app serves.

Each adapter declares its endpoints itself (:class:`~model_proxy.protocols.base.Route`); ``model_proxy.http.app``
builds its dispatch from :data:`PROTOCOLS` alone. Adding a protocol is a new folder here and one line in
:data:`PROTOCOLS` (``docs/extending.md``).
"""

from __future__ import annotations

from collections.abc import Callable

from model_proxy.protocols.anthropic import AnthropicAdapter
from model_proxy.protocols.base import ErrorInfo, ParsedRequest, ProtocolAdapter, Route
from model_proxy.protocols.google import GoogleAdapter
from model_proxy.protocols.openai_chat import OpenAIChatAdapter
from model_proxy.protocols.openai_responses import OpenAIResponsesAdapter
from polar_core.registry import Registry

__all__ = [
    "FALLBACK_PROTOCOL",
    "PROTOCOLS",
    "AnthropicAdapter",
    "ErrorInfo",
    "GoogleAdapter",
    "OpenAIChatAdapter",
    "OpenAIResponsesAdapter",
    "ParsedRequest",
    "ProtocolAdapter",
    "Route",
]

PROTOCOLS: Registry[Callable[[], ProtocolAdapter]] = Registry(
    "protocol",
    [
        # Registry order decides which adapter's marks claim a request no route matched; Google's come before
        # Anthropic's header, as they did when this routing was written by hand.
        (GoogleAdapter.protocol, GoogleAdapter),
        (AnthropicAdapter.protocol, AnthropicAdapter),
        (OpenAIChatAdapter.protocol, OpenAIChatAdapter),
        (OpenAIResponsesAdapter.protocol, OpenAIResponsesAdapter),
    ],
)
"""The completion record's ``protocol`` value → a factory of its adapter."""

FALLBACK_PROTOCOL = OpenAIChatAdapter.protocol
"""The shape of answers to requests that neither a route nor a mark attributes to a protocol."""
