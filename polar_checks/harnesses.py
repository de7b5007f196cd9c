"""The harnesses a task may name and the option keys each accepts: the catalogue the trainer's client checks a
task file against, the rollout server checks a submitted task against, and each gateway adapter declares its
options from (``gateway.harnesses``), so the three cannot disagree.

:data:`HARNESS_OPTIONS` is the registry of harness names; the gateway's adapter registry
(``gateway/harnesses/registry.py``) must hold the same names (a test holds it to that). Adding a harness is
one line here, an adapter module and one line there (``docs/extending.md``).

Option *values* are checked only by the adapter's ``prepare`` at the gateway, where the session is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from polar_core.errors import InvalidArgument
from polar_core.registry import Registry

__all__ = ["COMMON_OPTIONS", "HARNESS_OPTIONS", "check_harness", "check_options", "harness_names"]

COMMON_OPTIONS = frozenset({"env", "extra_args"})
"""Options every harness accepts: extra environment variables and extra command-line arguments."""

HARNESS_OPTIONS: Registry[frozenset[str]] = Registry(
    "harness",
    [
        ("claude-code", frozenset({"allowed_tools", "bare", "max_turns", "output_format"})),
        ("codex", frozenset({"context_window", "reasoning_effort", "sandbox"})),
        ("qwen-code", frozenset({"max_session_turns", "yolo"})),
        ("pi", frozenset({"context_window", "max_tokens", "provider_mode"})),
        ("gemini-cli", frozenset({"yolo"})),
        ("mini-swe-agent", frozenset({"command_timeout", "config", "step_limit", "venv"})),
        ("aider", frozenset({"context_window", "edit_format", "map_tokens", "test_cmd", "venv"})),
        ("openai-agents", frozenset({"api", "command_timeout", "max_turns", "venv"})),
        ("hermes-agent", frozenset({"context_window", "max_turns", "toolsets"})),
        ("openhands", frozenset({"context_window", "max_iterations", "max_output_tokens", "tools"})),
        ("opencode", frozenset({"agent", "auto", "context_window", "max_tokens"})),
        ("cline", frozenset({"auto_approve", "compaction", "json", "retries"})),
        ("continue", frozenset({"auto", "context_window", "format", "max_tokens"})),
        ("command", frozenset({"argv", "files", "log_paths"})),
    ],
)
"""Harness name (as in task files, spelled with hyphens) → its own option keys, besides :data:`COMMON_OPTIONS`."""


def harness_names() -> tuple[str, ...]:
    """The harness names a task may use."""
    return HARNESS_OPTIONS.names()


def check_options(harness: str, options: Mapping[str, Any], allowed: Iterable[str]) -> None:
    """Refuse option keys outside ``allowed`` and :data:`COMMON_OPTIONS`, naming the first as the field.

    Raises:
        InvalidArgument: An unknown key (``details["field"]`` is ``harness.<key>``).
    """
    known = set(allowed) | COMMON_OPTIONS
    unknown = sorted(set(options) - known)
    if unknown:
        raise InvalidArgument(
            f"harness.{unknown[0]}: unknown option(s) for harness {harness!r}: {', '.join(unknown)}; "
            f"known: {', '.join(sorted(known))}",
            details={"harness": harness, "field": f"harness.{unknown[0]}"},
        )


def check_harness(name: str, options: Mapping[str, Any]) -> None:
    """Refuse, at submission, a harness name or option key no harness knows; pure, needs no session.

    Raises:
        InvalidArgument: The name is unknown (field ``harness.name``) or an option key is not one of its
            options or :data:`COMMON_OPTIONS` (field ``harness.<key>``).
    """
    allowed = HARNESS_OPTIONS.get(name)
    if allowed is None:
        raise InvalidArgument(
            f"harness.name: unknown harness {name!r}; known: {', '.join(harness_names())}",
            details={"field": "harness.name", "harness": name},
        )
    check_options(name, options, allowed)
