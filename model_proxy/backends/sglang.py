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

from model_proxy.backends._http import HttpBackend
from model_proxy.errors import MalformedRequest
from model_proxy.models import GenerationChunk, GenerationRequest
from polar_core.errors import Internal

__all__ = ["SGLangBackend"]


def _finish_reason(meta: Mapping[str, Any]) -> str | None:
    reason = meta.get("finish_reason")
    if reason is None:
        return None
    if isinstance(reason, Mapping):
        return str(reason.get("type") or "stop")
    return str(reason)


class SGLangBackend(HttpBackend):
    """An SGLang server's native API.

    Attributes:
        name: ``"sglang"``.
        base_url: The server's root URL.
    """

    name = "sglang"
    path = "/generate"

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
        super().__init__(
            base_url, api_key=api_key, timeout_s=timeout_s, connect_timeout_s=connect_timeout_s, transport=transport
        )
        self._incremental = incremental_stream
        self._extra = dict(extra_sampling or {})

    async def _body(self, client: httpx.AsyncClient, request: GenerationRequest) -> dict[str, Any]:
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

    def _whole(self, payload: Any) -> GenerationChunk:
        if isinstance(payload, list):  # a batch answer to a single prompt
            payload = payload[0]
        meta = payload.get("meta_info") or {}
        return self._chunk(self._entries(meta), _finish_reason(meta) or "stop")

    async def _stream(self, events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[GenerationChunk]:
        seen = 0
        async for event in events:
            meta = event.get("meta_info") or {}
            entries = self._entries(meta)
            new = entries if self._incremental else entries[seen:]
            seen += len(new)
            finish = _finish_reason(meta)
            if new or finish is not None:
                yield self._chunk(new, finish)
