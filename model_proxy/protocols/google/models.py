"""Wire models of Google's ``generateContent`` API (camelCase on the wire; snake_case also accepted)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

__all__ = [
    "Content",
    "FunctionCall",
    "FunctionDeclaration",
    "FunctionResponse",
    "GenerateContentRequest",
    "GenerationConfig",
    "Part",
    "Tool",
]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow", alias_generator=to_camel, populate_by_name=True)


class FunctionCall(_Wire):
    """A model's function call."""

    name: str
    args: dict[str, Any] | None = None
    id: str | None = None


class FunctionResponse(_Wire):
    """A function's result sent back by the harness."""

    name: str
    response: dict[str, Any] | None = None
    id: str | None = None


class Part(_Wire):
    """One part: text (``thought`` marks reasoning), a function call or a function response."""

    text: str | None = None
    thought: bool | None = None
    thought_signature: str | None = None
    function_call: FunctionCall | None = None
    function_response: FunctionResponse | None = None


class Content(_Wire):
    """A turn: role ``user`` or ``model`` (or absent) and its parts."""

    role: str | None = None
    parts: list[Part] = Field(default_factory=list)


class FunctionDeclaration(_Wire):
    """A function tool; ``parameters`` is an OpenAPI schema, ``parametersJsonSchema`` a JSON schema."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    parameters_json_schema: dict[str, Any] | None = None


class Tool(_Wire):
    """A tool entry: function declarations, or a built-in tool (``googleSearch``, ...) that is ignored."""

    function_declarations: list[FunctionDeclaration] | None = None


class GenerationConfig(_Wire):
    """Sampling options."""

    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    stop_sequences: list[str] | None = None
    candidate_count: int | None = Field(default=None, ge=1)
    seed: int | None = None


class GenerateContentRequest(_Wire):
    """``POST /v1beta/models/{model}:generateContent`` (and ``:streamGenerateContent``)."""

    contents: list[Content] = Field(min_length=1)
    system_instruction: Content | str | None = None
    tools: list[Tool] | None = None
    tool_config: dict[str, Any] | None = None
    generation_config: GenerationConfig | None = None
    model: str | None = None
