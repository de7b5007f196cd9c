"""SGLang's native ``/generate`` endpoint as a backend, token IDs in and out.

The prompt goes in as ``input_ids`` with ``return_logprob: true``. Sampled IDs and their log-probabilities
are rebuilt from ``meta_info.output_token_logprobs`` (``[logprob, token_id, text]`` triples) rather than from
``text`` or OpenAI-style ``logprobs.content``, which can be truncated; call the server directly, since the
SGLang router strips ``meta_info``. A stop ID that ends generation is part of ``output_token_logprobs``.

Streaming (``stream: true``) uses server-sent events. By default SGLang sends *cumulative* ``meta_info``
in every event, so only entries past those already seen are new; set ``incremental_stream`` for servers run
with ``--incremental-streaming-output``, whose events carry only new entries.

SGLang reports ``log_softmax(logits / T)`` (after temperature, before top-k/top-p truncation) by default.
SGLang has no CPU build that installs here, so this client is unit-tested against a fake that returns the
documented response shape, not against a real server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import httpx

from model_proxy.backends._http import error_from_response, error_from_transport, sse_events
from model_proxy.core.types import GenerationChunk, GenerationRequest
from model_proxy.errors import BackendUnavailable, MalformedRequest
from polar_core.errors import FailedPrecondition, Internal

__all__ = ["SGLangBackend"]


def _finish_reason(meta: Mapping[str, Any]) -> str | None:
    reason = meta.get("finish_reason")
    if reason is None:
        return None
    if isinstance(reason, Mapping):
        return str(reason.get("type") or "stop")
    return str(reason)


class SGLangBackend:
    """An SGLang server's native API.

    Attributes:
        name: ``"sglang"``.
        base_url: The server's root URL.
    """

    name = "sglang"

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 5.0,
        incremental_stream: bool = False,
        extra_sampling: Mapping[str, Any] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """Create the backend; :meth:`start` opens the HTTP client.

        Args:
            base_url: Root URL of the server, e.g. ``http://127.0.0.1:30000``.
            api_key: Sent as a bearer token when the server wants one.
            timeout_s: Read timeout of a call, in seconds.
            connect_timeout_s: Connect timeout, in seconds.
            incremental_stream: Whether stream events carry only new tokens (see the module docstring).
            extra_sampling: Extra ``sampling_params`` fields (e.g. ``repetition_penalty``).
            transport: An httpx transport (tests use an in-process ASGI app).
        """
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        self._incremental = incremental_stream
        self._extra = dict(extra_sampling or {})
        self._transport = transport
        self._client: httpx.AsyncClient | None = None

    @property
    def _server(self) -> str:
        return f"sglang at {self.base_url}"

    async def start(self) -> None:
        """Open the HTTP client; idempotent."""
        if self._client is None:
            self._client = httpx.AsyncClient(
                base_url=self.base_url, headers=self._headers, timeout=self._timeout, transport=self._transport
            )

    async def close(self) -> None:
        """Close the HTTP client; idempotent."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    async def check_weights(self, path: str) -> str:
        """Refuse: this backend cannot load a checkpoint yet."""
        raise FailedPrecondition(f"{self.name} cannot load weights yet")

    async def load_weights(self, path: str) -> None:
        """Refuse: this backend cannot load a checkpoint yet."""
        raise FailedPrecondition(f"{self.name} cannot load weights yet")

    async def healthy(self) -> bool:
        """Whether ``/health`` answers 200."""
        if self._client is None:
            return False
        try:
            response = await self._client.get("/health", timeout=5.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    def _body(self, request: GenerationRequest) -> dict[str, Any]:
        if not request.prompt_token_ids:
            raise MalformedRequest("the prompt has no tokens")
        sampling = request.sampling
        params: dict[str, Any] = {
            "max_new_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else -1,
            "stop_token_ids": list(request.stop_token_ids),
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if sampling.seed is not None:
            params["sampling_seed"] = sampling.seed
        if sampling.stop:
            params["stop"] = list(sampling.stop)
        return {
            "input_ids": list(request.prompt_token_ids),
            "sampling_params": params | self._extra,
            "return_logprob": True,
            "logprob_start_len": -1,
            "stream": request.stream,
            "rid": request.request_id,
        }

    def _entries(self, meta: Mapping[str, Any]) -> list[Sequence[Any]]:
        entries = meta.get("output_token_logprobs")
        if entries is None:
            raise Internal(f"{self._server}: meta_info has no output_token_logprobs (return_logprob ignored?)")
        return list(entries)

    @staticmethod
    def _chunk(entries: Sequence[Sequence[Any]], finish: str | None) -> GenerationChunk:
        return GenerationChunk(
            token_ids=tuple(int(e[1]) for e in entries),
            logprobs=tuple(float(e[0]) for e in entries),
            finish_reason=finish,
        )

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Sample a response.

        Raises:
            BackendUnavailable: The server cannot be reached or failed (5xx, 503 with retry hint).
            BackendOverloaded: 429.
            BackendTimeout: The call ran past the read timeout.
            ContextLengthExceeded: The prompt does not fit the model's context.
            MalformedRequest: Other 4xx answers.
        """
        client = self._client
        if client is None:
            raise BackendUnavailable(f"{self._server}: backend not started")
        body = self._body(request)
        prompt_tokens = len(request.prompt_token_ids)
        try:
            async with client.stream("POST", "/generate", json=body) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise error_from_response(response, server=self._server, prompt_tokens=prompt_tokens)
                if not request.stream:
                    await response.aread()
                    payload = response.json()
                    if isinstance(payload, list):  # a batch answer to a single prompt
                        payload = payload[0]
                    meta = payload.get("meta_info") or {}
                    yield self._chunk(self._entries(meta), _finish_reason(meta) or "stop")
                    return
                seen = 0
                async for event in sse_events(response):
                    if "error" in event:
                        raise BackendUnavailable(f"{self._server} failed mid-stream: {event['error']}")
                    meta = event.get("meta_info") or {}
                    entries = self._entries(meta)
                    new = entries if self._incremental else entries[seen:]
                    seen += len(new)
                    finish = _finish_reason(meta)
                    if new or finish is not None:
                        yield self._chunk(new, finish)
                    if finish is not None:
                        return
                raise BackendUnavailable(f"{self._server}: the stream ended without a finish reason")
        except httpx.TransportError as exc:
            raise error_from_transport(exc, server=self._server) from exc
