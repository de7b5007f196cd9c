"""The openai_chat protocol adapter: wire models and translation."""

from __future__ import annotations

from model_proxy.protocols.openai_chat.adapter import OpenAIChatAdapter

__all__ = ["OpenAIChatAdapter"]
