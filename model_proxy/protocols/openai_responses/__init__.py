"""The openai_responses protocol adapter: wire models and translation."""

from __future__ import annotations

from model_proxy.protocols.openai_responses.adapter import OpenAIResponsesAdapter

__all__ = ["OpenAIResponsesAdapter"]
