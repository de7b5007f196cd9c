"""The proxy's internal request/response types: every provider protocol translates to and from these.

A provider adapter turns a harness request into an :class:`InternalRequest` (messages, tools, sampling); the
renderer turns it into prompt token IDs with the policy model's chat template; a backend turns a
:class:`GenerationRequest` (token IDs in) into :class:`GenerationChunk` s (token IDs and log-probabilities out);
the output parser turns sampled IDs into a :class:`ParsedOutput` (text, reasoning, tool calls), which the
adapter renders back in the provider's shape. :class:`EngineConfig` is the engine's typed configuration
(``model_proxy.app`` builds it from the settings). :class:`ServedPolicy` is what a proxy reports serving.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

__all__ = [
    "ChatMessage",
    "EngineConfig",
    "GenerationChunk",
    "GenerationRequest",
    "InternalRequest",
    "ParsedOutput",
    "SamplingParams",
    "ServedPolicy",
    "ToolCall",
    "ToolSpec",
]

Role = Literal["system", "user", "assistant", "tool"]


@dataclasses.dataclass(slots=True)
class ToolCall:
    """A tool call made by the assistant; ``arguments`` is the decoded JSON object."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclasses.dataclass(slots=True)
class ChatMessage:
    """One chat-template message.

    ``content`` is plain text (provider content parts are flattened by the adapter); ``tool_calls`` is set on
    assistant turns; ``tool_call_id``/``name`` on tool results; ``reasoning`` holds thinking text.
    """

    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = dataclasses.field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    reasoning: str | None = None

    def to_template_dict(self) -> dict[str, Any]:
        """Return the dict form that ``apply_chat_template`` expects."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        if self.reasoning:
            out["reasoning_content"] = self.reasoning
        return out


@dataclasses.dataclass(slots=True)
class ToolSpec:
    """A function tool offered to the model; ``parameters`` is a JSON schema object."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_template_dict(self) -> dict[str, Any]:
        """Return the OpenAI-style tool dict that chat templates render."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclasses.dataclass(frozen=True, slots=True)
class SamplingParams:
    """Sampling options sent to the backend. RL defaults: temperature 1.0, no truncation of the distribution.

    ``max_tokens`` of None means "up to the context limit"; the proxy resolves it before calling a backend.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form recorded on each completion."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "max_tokens": self.max_tokens,
            "stop": list(self.stop),
            "seed": self.seed,
        }


@dataclasses.dataclass(slots=True)
class InternalRequest:
    """A harness request after translation, before rendering."""

    protocol: str
    model: str
    messages: list[ChatMessage]
    tools: list[ToolSpec] = dataclasses.field(default_factory=list)
    sampling: SamplingParams = dataclasses.field(default_factory=SamplingParams)
    stream: bool = False
    tool_choice: str | None = None
    normalized: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The harness's request after normalisation, as stored in the completion record's ``request``."""


@dataclasses.dataclass(frozen=True, slots=True)
class GenerationRequest:
    """What a backend receives: token IDs in, nothing to re-render.

    Attributes:
        prompt_token_ids: The exact prompt; the backend must consume these IDs unchanged. Read-only: it is the
            rendered prompt's own list, which the completion record and the prefix cache share (a 35k-ID copy
            per call cost ~0.1-0.35 ms); a backend that needs its own copy makes one.
        sampling: Resolved sampling options (``max_tokens`` is set).
        stop_token_ids: IDs that end generation (the end-of-turn ID at least); a sampled stop ID is returned.
        request_id: Unique id of this call (the completion's ``call_id``).
        affinity_key: Routes calls of one session to the same replica (prefix-cache friendly).
        stream: Whether the caller wants incremental chunks; a backend that cannot stream yields one chunk.
    """

    prompt_token_ids: Sequence[int]
    sampling: SamplingParams
    stop_token_ids: tuple[int, ...]
    request_id: str
    affinity_key: str = ""
    stream: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class GenerationChunk:
    """Newly sampled IDs with their behaviour log-probabilities; the last chunk carries ``finish_reason``.

    ``finish_reason`` is ``"stop"`` (a stop ID or stop string was sampled), ``"length"`` or ``"abort"``.
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str | None = None


@dataclasses.dataclass(slots=True)
class ParsedOutput:
    """Sampled IDs decoded and split into the parts providers represent separately."""

    text: str
    reasoning: str | None = None
    tool_calls: list[ToolCall] = dataclasses.field(default_factory=list)
    tool_call_parse_error: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class EngineConfig:
    """Static limits of the engine.

    Attributes:
        context_length: The model's context in tokens (prompt plus output).
        default_max_tokens: Output limit when the harness gives none; 0 means "up to the context".
        backend_timeout_s: Limit on one backend call, first token to last.
        stop_token_ids: IDs that end a turn (sent to the backend with every call).
    """

    context_length: int
    default_max_tokens: int
    backend_timeout_s: float
    stop_token_ids: tuple[int, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class ServedPolicy:
    """What the proxy serves now.

    Attributes:
        policy_version: The version stamped on new calls.
        weights_path: The checkpoint last loaded; empty while the configured weights are served.
        paused: Whether generation is paused.
        in_flight: Calls between the generation gate and their answer.
    """

    policy_version: str
    weights_path: str
    paused: bool
    in_flight: int
