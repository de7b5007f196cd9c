"""Request normalisation: rules that remove per-request volatile text which would break prefix merging.

A rule edits an :class:`InternalRequest` in place and says whether it changed anything; the names of the rules
that fired go on the completion record (``normalization_rules_fired``). The built-in rule
``strip_anthropic_billing_header`` removes Claude Code's per-request ``x-anthropic-billing-header: ...`` system
line, which changes on every call. More line-stripping rules can be configured as name -> regex
(``strip_system_line_patterns``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Protocol

from model_proxy.models import InternalRequest
from polar_core.errors import InvalidArgument

__all__ = ["NormalizationRule", "StripSystemLines", "apply_rules", "build_rules"]


class NormalizationRule(Protocol):
    """One normalisation rule."""

    name: str

    def apply(self, request: InternalRequest) -> bool:
        """Edit ``request`` in place; return whether anything changed.

        A rule replaces the messages it changes (``request.messages``): it never changes a
        :class:`~model_proxy.models.ChatMessage` itself, which the session's translation memo may share.
        """
        ...


class StripSystemLines:
    """Removes system-prompt lines matching a regex (whole lines, with their newline)."""

    def __init__(self, name: str, pattern: str) -> None:
        self.name = name
        try:
            self._line = re.compile(rf"^(?:{pattern}).*(?:\n|$)", re.MULTILINE)
        except re.error as exc:
            raise InvalidArgument(f"normalisation rule {name!r}: bad pattern: {exc}") from None

    def apply(self, request: InternalRequest) -> bool:
        changed = False
        kept = []
        for msg in request.messages:
            if msg.role == "system" and msg.content:
                new = self._line.sub("", msg.content)
                if new != msg.content:
                    changed = True
                    if not new.strip():
                        continue
                    # A new message: translated messages may be shared with the session's next request.
                    msg = dataclasses.replace(msg, content=new)
            kept.append(msg)
        request.messages = kept
        return changed


def _builtin() -> dict[str, NormalizationRule]:
    return {
        "strip_anthropic_billing_header": StripSystemLines(
            "strip_anthropic_billing_header", r"x-anthropic-billing-header:"
        ),
    }


def build_rules(names: Sequence[str], patterns: Mapping[str, str]) -> list[NormalizationRule]:
    """Build the configured rules: built-ins by name, then ``patterns`` (name -> line regex).

    Raises:
        InvalidArgument: An unknown built-in name or a bad regex.
    """
    builtin = _builtin()
    rules: list[NormalizationRule] = []
    for name in names:
        if name not in builtin:
            raise InvalidArgument(f"unknown normalisation rule {name!r} (built-in: {sorted(builtin)})")
        rules.append(builtin[name])
    rules.extend(StripSystemLines(name, pattern) for name, pattern in patterns.items())
    return rules


def apply_rules(rules: Sequence[NormalizationRule], request: InternalRequest) -> list[str]:
    """Apply rules in order; return the names of those that changed the request."""
    return [rule.name for rule in rules if rule.apply(request)]
