"""Wire models of the OpenAI Responses API (tolerant: input items and tools are read field by field)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ResponsesRequest"]


class ResponsesRequest(BaseModel):
    """``POST /v1/responses``.

    ``input`` items: ``message`` (also without ``type``), ``function_call``, ``function_call_output``,
    ``custom_tool_call``, ``custom_tool_call_output``, ``reasoning``; others are recorded as ignored.
    ``tools``: ``function``, ``custom``, ``namespace`` (flattened); others (``web_search``, ...) are ignored.
    """

    model_config = ConfigDict(extra="allow")

    model: str
    input: str | list[dict[str, Any]] = Field(default_factory=list)
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool | None = False
    include: list[str] | None = None
    reasoning: dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
