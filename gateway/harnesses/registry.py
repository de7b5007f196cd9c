"""The harness adapter registry: harness name (as in task files) → adapter."""

from __future__ import annotations

from collections.abc import Callable

from gateway.harnesses.aider import AiderAdapter
from gateway.harnesses.base import HarnessAdapter
from gateway.harnesses.claude_code import ClaudeCodeAdapter
from gateway.harnesses.cline import ClineAdapter
from gateway.harnesses.codex import CodexAdapter
from gateway.harnesses.command import CommandAdapter
from gateway.harnesses.continue_cli import ContinueCliAdapter
from gateway.harnesses.gemini_cli import GeminiCliAdapter
from gateway.harnesses.hermes_agent import HermesAgentAdapter
from gateway.harnesses.mini_swe_agent import MiniSweAgentAdapter
from gateway.harnesses.openai_agents import OpenAIAgentsAdapter
from gateway.harnesses.opencode import OpencodeAdapter
from gateway.harnesses.openhands import OpenHandsAdapter
from gateway.harnesses.pi import PiAdapter
from gateway.harnesses.qwen_code import QwenCodeAdapter
from polar_core.errors import InvalidArgument

__all__ = ["adapter_names", "get_adapter"]


def _factories() -> dict[str, Callable[[], HarnessAdapter]]:
    return {
        "claude-code": ClaudeCodeAdapter,
        "codex": CodexAdapter,
        "qwen-code": QwenCodeAdapter,
        "pi": PiAdapter,
        "gemini-cli": GeminiCliAdapter,
        "mini-swe-agent": MiniSweAgentAdapter,
        "aider": AiderAdapter,
        "openai-agents": OpenAIAgentsAdapter,
        "hermes-agent": HermesAgentAdapter,
        "openhands": OpenHandsAdapter,
        "opencode": OpencodeAdapter,
        "cline": ClineAdapter,
        "continue": ContinueCliAdapter,
        "command": CommandAdapter,
    }


def adapter_names() -> tuple[str, ...]:
    """The names :func:`get_adapter` knows."""
    return tuple(_factories())


def get_adapter(name: str) -> HarnessAdapter:
    """Return a new adapter for harness ``name``.

    Raises:
        InvalidArgument: No harness has that name.
    """
    factory = _factories().get(name)
    if factory is None:
        raise InvalidArgument(
            f"unknown harness {name!r}; known: {', '.join(adapter_names())}", details={"harness": name}
        )
    return factory()
