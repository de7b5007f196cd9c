"""Wire models of the Anthropic Messages API (the subset a proxy reads; extra fields are tolerated)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Block", "Message", "MessagesRequest", "Tool", "ToolChoice"]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")


class Block(_Wire):
    """A content block: text, image, tool_use, tool_result, thinking, redacted_thinking, document, ..."""

    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: Any = None
    tool_use_id: str | None = None
    content: str | list[Block] | None = None
    is_error: bool | None = None
    thinking: str | None = None
    signature: str | None = None
    cache_control: dict[str, Any] | None = None


class Message(_Wire):
    """A conversation turn; Claude Code also sends ``role: "system"`` turns."""

    role: Literal["user", "assistant", "system"]
    content: str | list[Block]


class Tool(_Wire):
    """A tool: a client tool (``input_schema``) or a server/Anthropic-defined tool (``type`` set)."""

    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None


class ToolChoice(_Wire):
    """``auto``, ``any``, ``tool`` (with ``name``) or ``none``."""

    type: str
    name: str | None = None


class MessagesRequest(_Wire):
    """``POST /v1/messages`` (and ``/v1/messages/count_tokens``, which has no ``max_tokens``)."""

    model: str
    messages: list[Message]
    max_tokens: int | None = Field(default=None, ge=1)
    system: str | list[Block] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    stream: bool = False
    thinking: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
