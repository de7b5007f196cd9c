"""The harness adapter registry: harness name (as in task files) → adapter.

Each adapter names itself (its ``name``, with its option keys from ``polar_checks.harnesses.HARNESS_OPTIONS``,
the catalogue the client and the rollout server check tasks against); :data:`ADAPTERS` lists the adapter classes
once. Adding a harness is an adapter module, one line in ``_ADAPTER_CLASSES`` and one in ``HARNESS_OPTIONS``
(``docs/extending.md``); ``gateway/harnesses/tests/test_registry.py`` holds the two registries to the same names.
"""

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
from polar_core.registry import Registry

__all__ = ["ADAPTERS", "adapter_names", "get_adapter"]

_ADAPTER_CLASSES: tuple[Callable[[], HarnessAdapter], ...] = (
    ClaudeCodeAdapter,
    CodexAdapter,
    QwenCodeAdapter,
    PiAdapter,
    GeminiCliAdapter,
    MiniSweAgentAdapter,
    AiderAdapter,
    OpenAIAgentsAdapter,
    HermesAgentAdapter,
    OpenHandsAdapter,
    OpencodeAdapter,
    ClineAdapter,
    ContinueCliAdapter,
    CommandAdapter,
)

ADAPTERS: Registry[Callable[[], HarnessAdapter]] = Registry("harness", [(cls().name, cls) for cls in _ADAPTER_CLASSES])
"""Harness name → adapter factory, in the order error messages list them."""


def adapter_names() -> tuple[str, ...]:
    """The names :func:`get_adapter` knows."""
    return ADAPTERS.names()


def get_adapter(name: str) -> HarnessAdapter:
    """Return a new adapter for harness ``name``.

    Raises:
        InvalidArgument: No harness has that name (the message lists the known ones).
    """
    return ADAPTERS.get_or_raise(name, details={"harness": name})()
