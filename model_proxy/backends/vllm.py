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

from model_proxy.backends._http import HttpBackend, error_from_response, error_from_transport
from model_proxy.errors import BackendUnavailable, MalformedRequest
from model_proxy.models import GenerationChunk, GenerationRequest
from polar_core.errors import Internal

__all__ = ["VLLMBackend"]


class VLLMBackend(HttpBackend):
    """A vLLM OpenAI-compatible server.

    Attributes:
        name: ``"vllm"``.
        base_url: The server's root URL (without ``/v1``).
    """

    name = "vllm"
    path = "/v1/completions"

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
        super().__init__(
            base_url, api_key=api_key, timeout_s=timeout_s, connect_timeout_s=connect_timeout_s, transport=transport
        )
        self._model = model
        self._extra = dict(extra_body or {})

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

    async def _body(self, client: httpx.AsyncClient, request: GenerationRequest) -> dict[str, Any]:
        sampling = request.sampling
        if not request.prompt_token_ids:
            raise MalformedRequest("the prompt has no tokens")
        body: dict[str, Any] = {
            "model": await self._model_name(client),
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

    def _whole(self, payload: Any) -> GenerationChunk:
        return self._chunk(payload["choices"][0], streaming=False)

    async def _stream(self, events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[GenerationChunk]:
        async for event in events:
            choices = event.get("choices") or []
            if not choices:
                continue
            chunk = self._chunk(choices[0], streaming=True)
            if chunk.token_ids or chunk.finish_reason is not None:
                yield chunk
