"""The anthropic protocol adapter: wire models and translation."""

from __future__ import annotations

from model_proxy.protocols.anthropic.adapter import AnthropicAdapter

__all__ = ["AnthropicAdapter"]
