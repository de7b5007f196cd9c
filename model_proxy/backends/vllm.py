"""vLLM's OpenAI-compatible server as a backend, token IDs in and out through ``/v1/completions``.

The prompt is sent as a list of token IDs (no server-side template or tokenisation) with
``return_token_ids: true``, so the server reports the exact sampled IDs, and ``logprobs: 0``, which gives the
log-probability of each sampled token only. Streaming uses server-sent events; each chunk carries its
``token_ids`` and ``logprobs.token_logprobs``.

Log-probabilities: vLLM reports, by default (``--logprobs-mode raw_logprobs``), ``log_softmax(logits)``
*before* temperature. Start the server with ``--logprobs-mode processed_logprobs`` to get
``log_softmax(logits / T)``; then top-k/top-p truncation is included too (the value is that of the
truncated, renormalised distribution), unlike the transformers backend. With RL defaults (temperature 1,
no truncation) every mode gives the same number.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

from model_proxy.backends._http import error_from_response, error_from_transport, sse_events
from model_proxy.core.types import GenerationChunk, GenerationRequest
from model_proxy.errors import BackendUnavailable, MalformedRequest
from polar_core.errors import FailedPrecondition, Internal

__all__ = ["VLLMBackend"]


class VLLMBackend:
    """A vLLM OpenAI-compatible server.

    Attributes:
        name: ``"vllm"``.
        base_url: The server's root URL (without ``/v1``).
    """

    name = "vllm"

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 5.0,
        extra_body: Mapping[str, Any] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """Create the backend; :meth:`start` opens the HTTP client.

        Args:
            base_url: Root URL of the server, e.g. ``http://127.0.0.1:8000``.
            model: Served model name; default: the first one ``/v1/models`` lists.
            api_key: Sent as a bearer token when the server wants one.
            timeout_s: Read timeout of a call, in seconds.
            connect_timeout_s: Connect timeout, in seconds.
            extra_body: Extra fields merged into every request body (e.g. ``repetition_penalty``).
            transport: An httpx transport (tests use an in-process ASGI app).
        """
        self.base_url = base_url.rstrip("/")
        self._model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        self._extra = dict(extra_body or {})
        self._transport = transport
        self._client: httpx.AsyncClient | None = None

    @property
    def _server(self) -> str:
        return f"vllm at {self.base_url}"

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

    async def _model_name(self, client: httpx.AsyncClient) -> str:
        if self._model is None:
            try:
                response = await client.get("/v1/models")
            except httpx.TransportError as exc:
                raise error_from_transport(exc, server=self._server) from exc
            if response.status_code != 200:
                raise error_from_response(response, server=self._server, prompt_tokens=0)
            models = response.json().get("data") or []
            if not models:
                raise BackendUnavailable(f"{self._server} serves no model")
            self._model = str(models[0]["id"])
        return self._model

    def _body(self, model: str, request: GenerationRequest) -> dict[str, Any]:
        sampling = request.sampling
        if not request.prompt_token_ids:
            raise MalformedRequest("the prompt has no tokens")
        body: dict[str, Any] = {
            "model": model,
            "prompt": list(request.prompt_token_ids),
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "logprobs": 0,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "stop_token_ids": list(request.stop_token_ids),
            "stream": request.stream,
        }
        if sampling.top_k > 0:
            body["top_k"] = sampling.top_k
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        return body | self._extra

    def _chunk(self, choice: Mapping[str, Any], *, streaming: bool) -> GenerationChunk:
        ids = [int(t) for t in choice.get("token_ids") or []]
        logprobs_obj = choice.get("logprobs") or {}
        logprobs = [float(x) for x in logprobs_obj.get("token_logprobs") or []]
        if len(logprobs) != len(ids):
            raise Internal(
                f"{self._server}: {len(ids)} token IDs but {len(logprobs)} log-probabilities; "
                "the server must support return_token_ids and logprobs"
            )
        finish = choice.get("finish_reason")
        if not ids and not streaming and finish is None:
            raise Internal(f"{self._server}: the response has no token_ids (return_token_ids unsupported?)")
        return GenerationChunk(tuple(ids), tuple(logprobs), str(finish) if finish is not None else None)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Sample a response.

        Raises:
            BackendUnavailable: The server cannot be reached or failed (5xx, 503 with retry hint).
            BackendOverloaded: 429.
            BackendTimeout: The call ran past the read timeout.
            ContextLengthExceeded: The prompt and ``max_tokens`` do not fit the model's context.
            MalformedRequest: Other 4xx answers.
        """
        client = self._client
        if client is None:
            raise BackendUnavailable(f"{self._server}: backend not started")
        body = self._body(await self._model_name(client), request)
        prompt_tokens = len(request.prompt_token_ids)
        try:
            async with client.stream("POST", "/v1/completions", json=body) as response:
                if response.status_code != 200:
                    await response.aread()
                    raise error_from_response(response, server=self._server, prompt_tokens=prompt_tokens)
                if not request.stream:
                    await response.aread()
                    yield self._chunk(response.json()["choices"][0], streaming=False)
                    return
                finished = False
                async for event in sse_events(response):
                    if "error" in event:
                        raise BackendUnavailable(f"{self._server} failed mid-stream: {event['error']}")
                    choices = event.get("choices") or []
                    if not choices:
                        continue
                    chunk = self._chunk(choices[0], streaming=True)
                    if chunk.token_ids or chunk.finish_reason is not None:
                        finished = chunk.finish_reason is not None
                        yield chunk
                    if finished:
                        return
                raise BackendUnavailable(f"{self._server}: the stream ended without a finish reason")
        except httpx.TransportError as exc:
            raise error_from_transport(exc, server=self._server) from exc
