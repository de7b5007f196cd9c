"""Errors of the model proxy.

Every one maps once, at the edge, to a gRPC status (via :mod:`polar_core.grpc_errors`) or to a provider-shaped
HTTP error (via ``model_proxy.http.errors``)::

    polar_core.errors.PolarError
    ├── InvalidArgument
    │   ├── MalformedRequest          400 invalid_request_error
    │   └── ContextLengthExceeded     400 context_length_exceeded (the provider's own shape)
    ├── Unauthenticated
    │   └── UnknownSession            401 authentication_error
    ├── ResourceExhausted
    │   ├── BackendOverloaded         529 (Anthropic) / 503 with retry-after
    │   └── GenerationAborted         the same: a weight update cut the call (PauseGeneration abort_in_flight)
    ├── Unavailable
    │   └── BackendUnavailable        503 with retry-after
    ├── DeadlineExceeded
    │   └── BackendTimeout            504
    └── FailedPrecondition
        └── ScriptExhausted           the scripted backend ran out of turns (a test bug, loud)
"""

from __future__ import annotations

from polar_core.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)

__all__ = [
    "BackendOverloaded",
    "BackendTimeout",
    "BackendUnavailable",
    "ContextLengthExceeded",
    "GenerationAborted",
    "MalformedRequest",
    "ScriptExhausted",
    "UnknownSession",
]


class MalformedRequest(InvalidArgument):
    """The harness's body is not valid JSON or does not fit the provider's schema."""


class ContextLengthExceeded(InvalidArgument):
    """The rendered prompt (plus requested output) is longer than the model's context."""

    def __init__(self, prompt_tokens: int, limit: int) -> None:
        super().__init__(
            f"prompt is {prompt_tokens} tokens, more than the model's context of {limit} tokens",
            details={"prompt_tokens": str(prompt_tokens), "limit": str(limit)},
        )
        self.prompt_tokens = prompt_tokens
        self.limit = limit


class UnknownSession(Unauthenticated):
    """The API key is not the token of an open session."""


class BackendOverloaded(ResourceExhausted):
    """The backend refused for load; retry later."""


class GenerationAborted(ResourceExhausted):
    """A weight update cut the call (``PauseGeneration`` with ``abort_in_flight``); the harness should retry.

    The harness gets its provider's retryable error (Anthropic 529 ``overloaded_error``, OpenAI 503
    ``server_error``, Google 503 ``UNAVAILABLE``; an error event once a stream has begun), never the partial
    answer; the call's record is kept with ``finish_reason`` ``abort`` and the reconstructor leaves it out.
    """


class BackendUnavailable(Unavailable):
    """The backend cannot be reached or is not ready."""


class BackendTimeout(DeadlineExceeded):
    """The backend did not answer in time."""


class ScriptExhausted(FailedPrecondition):
    """The scripted backend has no turn left for this call."""
