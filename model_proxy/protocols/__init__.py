"""Provider protocol adapters, one folder per protocol."""

from __future__ import annotations

from model_proxy.protocols.anthropic import AnthropicAdapter
from model_proxy.protocols.base import ErrorInfo, ParsedRequest, ProtocolAdapter
from model_proxy.protocols.google import GoogleAdapter
from model_proxy.protocols.openai_chat import OpenAIChatAdapter
from model_proxy.protocols.openai_responses import OpenAIResponsesAdapter

__all__ = [
    "AnthropicAdapter",
    "ErrorInfo",
    "GoogleAdapter",
    "OpenAIChatAdapter",
    "OpenAIResponsesAdapter",
    "ParsedRequest",
    "ProtocolAdapter",
]
