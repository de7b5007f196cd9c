"""Wire models of the OpenAI Chat Completions API (tolerant of extra fields)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ChatMessageIn", "ChatRequest", "FunctionCallIn", "ToolCallIn", "ToolIn"]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")


class FunctionCallIn(_Wire):
    """The function of an assistant tool call; ``arguments`` is a JSON string (an object is tolerated)."""

    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(_Wire):
    """An assistant tool call replayed by the harness."""

    id: str
    type: str = "function"
    function: FunctionCallIn


class ChatMessageIn(_Wire):
    """A chat message; ``content`` may be a string, a list of parts, or null."""

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[Any] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class FunctionDef(_Wire):
    """A function tool's definition."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolIn(_Wire):
    """A tool; only ``function`` tools are offered to the model."""

    type: str = "function"
    function: FunctionDef | None = None


class StreamOptions(_Wire):
    """Streaming options."""

    include_usage: bool = False


class ChatRequest(_Wire):
    """``POST /v1/chat/completions``."""

    model: str
    messages: list[ChatMessageIn] = Field(min_length=1)
    tools: list[ToolIn] | None = None
    tool_choice: str | dict[str, Any] | None = None
    stop: str | list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    n: int | None = Field(default=None, ge=1)
