"""The model proxy's seams (``typing.Protocol``): the inference backend, token IDs in, token IDs out.

Real implementations live in :mod:`model_proxy.backends`; in-memory fakes for unit tests in
:mod:`model_proxy.testing` and ``model_proxy.backends.scripted``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from model_proxy.models import GenerationChunk, GenerationRequest

__all__ = ["Backend"]


@runtime_checkable
class Backend(Protocol):
    """An inference backend (Triton, vLLM, SGLang, transformers in process, scripted).

    Implementations never re-render or re-tokenise: they consume ``request.prompt_token_ids`` as given and
    report exactly the sampled IDs with their raw log-probabilities (before any logits processor other than
    temperature). Errors are raised as :mod:`model_proxy.errors` exceptions (``BackendUnavailable``,
    ``BackendOverloaded``, ``ContextLengthExceeded``, ...), never as raw transport exceptions.
    """

    name: str
    """Backend kind name as used on the command line (``triton``, ``vllm``, ...)."""

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Sample a response; yields chunks in order, the last with ``finish_reason`` set."""
        ...

    async def start(self) -> None:
        """Open connections / load the model; idempotent."""
        ...

    async def close(self) -> None:
        """Release connections and processes; idempotent."""
        ...

    async def healthy(self) -> bool:
        """Whether the backend can serve a call now."""
        ...

    async def check_weights(self, path: str) -> str:
        """Check that the checkpoint directory ``path`` could be loaded, without touching the served model.

        Returns:
            The checkpoint's architecture name (empty when the backend does not read it).

        Raises:
            FailedPrecondition: The checkpoint is unreadable or foreign (architecture, vocabulary, sizes), or
                the backend cannot load weights at all; the message says which.
        """
        ...

    async def load_weights(self, path: str) -> None:
        """Serve the checkpoint directory ``path`` from now on (generation is paused while this runs).

        Raises:
            FailedPrecondition: As :meth:`check_weights`, or the load failed; the served model is unchanged.
        """
        ...
