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

Weight updates: :meth:`SGLangBackend.load_weights` validates the checkpoint on the proxy host (as the vLLM
backend does, against option ``model_dir`` or the ``model_path`` that ``/model_info`` or ``/get_model_info``
reports), then sends ``POST /update_weights_from_disk {"model_path", "weight_version", "abort_all_requests":
false}``. SGLang answers ``{"success", "message", "num_paused_requests"}``: 200 on success, 400 on failure,
after which it has rolled back to the old weights and keeps serving them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from model_proxy.backends._http import HttpBackend, response_message
from model_proxy.errors import MalformedRequest
from model_proxy.models import GenerationChunk, GenerationRequest
from polar_core.errors import FailedPrecondition, Internal

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
        model_dir: str | Path | None = None,
    ) -> None:
        """Create the backend; :meth:`start` opens the HTTP client.

        Args:
            base_url: Root URL of the server, e.g. ``http://127.0.0.1:30000``.
            api_key: Sent as a bearer token when the server wants one.
            timeout_s: Read timeout of a call, in seconds.
            connect_timeout_s: Connect timeout, in seconds.
            incremental_stream: Whether stream events carry only new tokens (see the module docstring).
            extra_sampling: Extra ``sampling_params`` fields (e.g. ``repetition_penalty``).
            model_dir: The served checkpoint's directory on the proxy host, which weight updates are checked
                against; default: the ``model_path`` the server reports, when it is a directory here.
        """
        super().__init__(base_url, api_key=api_key, timeout_s=timeout_s, connect_timeout_s=connect_timeout_s)
        self._incremental = incremental_stream
        self._extra = dict(extra_sampling or {})
        self._served_dir = Path(model_dir) if model_dir is not None else None
        self._lost: str | None = None

    async def healthy(self) -> bool:
        """Whether ``/health`` answers 200 and no weight update failed with a server error."""
        return self._lost is None and await super().healthy()

    async def _discover_model_dir(self) -> str | None:
        for path in ("/model_info", "/get_model_info"):
            response = await self._admin("GET", path, what="asking for the served model")
            if response.status_code == 200:
                reported = response.json().get("model_path")
                return str(reported) if reported else None
        return None

    async def check_weights(self, path: str) -> str:
        """Validate checkpoint ``path`` on the proxy host against the served model; touches nothing.

        Returns:
            The checkpoint's architecture.

        Raises:
            FailedPrecondition: The replica failed an earlier update, or the checkpoint is unfit.
        """
        if self._lost is not None:
            raise FailedPrecondition(f"{self._server} is lost: {self._lost}; restart it")
        return (await self._check_local(path)).architecture

    async def load_weights(self, path: str) -> None:
        """``POST /update_weights_from_disk`` with ``path`` (also the weight version), after :meth:`check_weights`.

        Raises:
            FailedPrecondition: As :meth:`check_weights`; the endpoint is absent (404); SGLang refused (400 or
                ``success: false``: it rolled back and serves the old weights); or a server error (5xx, the
                replica is then marked lost).
        """
        await self.check_weights(path)
        body = {"model_path": path, "weight_version": path, "abort_all_requests": False}
        response = await self._admin("POST", "/update_weights_from_disk", what="updating the weights", json=body)
        status = response.status_code
        if status == 404:
            raise FailedPrecondition(f"{self._server} has no /update_weights_from_disk endpoint")
        if status >= 500:
            self._lost = f"updating the weights from {path!r} failed ({status}: {response_message(response)})"
            raise FailedPrecondition(f"{self._server} is lost: {self._lost}")
        try:
            answer = response.json()
        except ValueError:
            answer = {}
        if status != 200 or not isinstance(answer, dict) or not answer.get("success"):
            raise FailedPrecondition(
                f"{self._server} refused the weights in {path!r} ({status}: {response_message(response)}); "
                "it keeps serving the old weights"
            )
        self._now_serving(path)

    async def _body(self, request: GenerationRequest) -> dict[str, Any]:
        if not request.prompt_token_ids:
            raise MalformedRequest("the prompt has no tokens")
        sampling = request.sampling
        params: dict[str, Any] = {
            "max_new_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else -1,
            "stop_token_ids": request.stop_token_ids,
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if sampling.seed is not None:
            params["sampling_seed"] = sampling.seed
        if sampling.stop:
            params["stop"] = list(sampling.stop)
        return {
            "input_ids": request.prompt_token_ids,  # a tuple: orjson writes it as an array, with no copy
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
