"""What a running call reports to a protocol adapter: output deltas in order, then the final result."""

from __future__ import annotations

import dataclasses

from model_proxy.models import ParsedOutput, ToolCall
from polar_core.records import CompletionRecord

__all__ = ["CallResult", "OutputEvent", "ReasoningDelta", "TextDelta", "ToolCallDone"]


@dataclasses.dataclass(frozen=True, slots=True)
class TextDelta:
    """New visible answer text."""

    text: str


@dataclasses.dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """New reasoning (thinking) text."""

    text: str


@dataclasses.dataclass(frozen=True, slots=True)
class ToolCallDone:
    """A complete, parsed tool call; ``index`` counts tool calls of this response from 0."""

    index: int
    call: ToolCall


@dataclasses.dataclass(frozen=True, slots=True)
class CallResult:
    """The end of a call, reported after its completion record is durable.

    Attributes:
        call_id: The completion's id (also used to derive response ids).
        model: The model name the harness asked for.
        parsed: The whole answer.
        finish_reason: ``stop``, ``length``, ``tool_calls`` or ``abort``.
        stop_sequence: The stop string that ended the answer, when one did.
        prompt_tokens: Number of prompt tokens.
        completion_tokens: Number of sampled tokens.
        record: The completion record as written.
    """

    call_id: str
    model: str
    parsed: ParsedOutput
    finish_reason: str
    stop_sequence: str | None
    prompt_tokens: int
    completion_tokens: int
    record: CompletionRecord


OutputEvent = TextDelta | ReasoningDelta | ToolCallDone
"""A delta of a streaming answer."""
