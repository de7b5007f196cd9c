"""Errors of the model proxy.

Every one maps once, at the edge, to a gRPC status (via :mod:`polar_core.grpc_errors`) or to a provider-shaped
HTTP error (via ``model_proxy.http.errors``)::

    polar_core.errors.PolarError
    ├── InvalidArgument
    │   ├── MalformedRequest          400 invalid_request_error (also: not UTF-8, a lone surrogate)
    │   ├── RequestTooLarge           413 (the body is over ``max_body_bytes``, however it is sent)
    │   └── ContextLengthExceeded     400 context_length_exceeded (the provider's own shape)
    ├── Unauthenticated
    │   └── UnknownSession            401 authentication_error
    ├── ResourceExhausted
    │   ├── TooManyCalls              429 with retry-after (the session's concurrent-call cap)
    │   ├── BackendOverloaded         529 (Anthropic) / 503 with retry-after
    │   └── GenerationAborted         the same: a weight update cut the call (PauseGeneration abort_in_flight)
    ├── Unavailable
    │   ├── BackendUnavailable        503 with retry-after
    │   └── RecordNotWritten          503 with retry-after (the completion record could not be made durable)
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
    "RecordNotWritten",
    "RequestTooLarge",
    "ScriptExhausted",
    "TooManyCalls",
    "UnknownSession",
]


class MalformedRequest(InvalidArgument):
    """The harness's body is not valid JSON or does not fit the provider's schema."""


class RequestTooLarge(InvalidArgument):
    """The request body is larger than ``max_body_bytes`` (declared or counted while reading)."""


class ContextLengthExceeded(InvalidArgument):
    """The rendered prompt (plus requested output) is longer than the model's context.

    ``at_least`` marks a lower bound: the prompt was refused before it was tokenised in full.
    """

    def __init__(self, prompt_tokens: int, limit: int, *, at_least: bool = False) -> None:
        size = f"at least {prompt_tokens}" if at_least else str(prompt_tokens)
        super().__init__(
            f"prompt is {size} tokens, more than the model's context of {limit} tokens",
            details={"prompt_tokens": str(prompt_tokens), "limit": str(limit)},
        )
        self.prompt_tokens = prompt_tokens
        self.limit = limit


class UnknownSession(Unauthenticated):
    """The API key is not the token of an open session."""


class TooManyCalls(ResourceExhausted):
    """The session already has ``max_calls_per_session`` calls in flight; retry when one has finished."""


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


class RecordNotWritten(Unavailable):
    """The completion record could not be written durably (disk full, I/O error); the call is not answered."""


class BackendTimeout(DeadlineExceeded):
    """The backend did not answer in time."""


class ScriptExhausted(FailedPrecondition):
    """The scripted backend has no turn left for this call."""
