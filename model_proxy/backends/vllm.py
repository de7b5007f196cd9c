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

Weight updates (:meth:`VLLMBackend.check_weights`, :meth:`VLLMBackend.load_weights`) use the endpoints vLLM
mounts only when the server runs with ``VLLM_SERVER_DEV_MODE=1``: ``POST /pause?mode=wait``, ``POST
/collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}`` (an in-place, layer-wise
reload from a Hugging Face directory the *server* can read), ``POST /update_weight_version`` and ``POST
/resume``. A failed reload leaves vLLM's engine broken (it dies on its next forward pass), so the checkpoint
is validated on the proxy host first (:mod:`model_proxy.backends.checkpoint`) against the served model's
directory (option ``model_dir``, else the ``root`` that ``/v1/models`` reports), and a checkpoint with tied
input/output embeddings is refused: vLLM 0.32's CPU build reloads everything but a tied output layer, which
keeps the old weights. A 5xx from the reload marks the replica lost (:meth:`VLLMBackend.healthy` is then
false); restart it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from model_proxy.backends._http import (
    HttpBackend,
    TransportError,
    error_from_response,
    error_from_transport,
    response_message,
)
from model_proxy.errors import BackendUnavailable, MalformedRequest
from model_proxy.models import GenerationChunk, GenerationRequest
from polar_core.errors import FailedPrecondition, Internal

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
        model_dir: str | Path | None = None,
    ) -> None:
        """Create the backend; :meth:`start` opens the HTTP client.

        Args:
            base_url: Root URL of the server, e.g. ``http://127.0.0.1:8000``.
            model: Served model name; default: the first one ``/v1/models`` lists.
            api_key: Sent as a bearer token when the server wants one.
            timeout_s: Read timeout of a call, in seconds.
            connect_timeout_s: Connect timeout, in seconds.
            extra_body: Extra fields merged into every request body (e.g. ``repetition_penalty``).
            model_dir: The served checkpoint's directory on the proxy host, which weight updates are checked
                against; default: the ``root`` that ``/v1/models`` reports, when it is a directory here.
        """
        super().__init__(base_url, api_key=api_key, timeout_s=timeout_s, connect_timeout_s=connect_timeout_s)
        self._model = model
        self._extra = dict(extra_body or {})
        self._served_dir = Path(model_dir) if model_dir is not None else None
        self._lost: str | None = None

    async def _model_name(self) -> str:
        if self._model is None:
            try:
                response = await self._request("GET", "/v1/models")
            except TransportError as exc:
                raise error_from_transport(exc, server=self._server) from exc
            if response.status_code != 200:
                raise error_from_response(response, server=self._server, prompt_tokens=0)
            models = response.json().get("data") or []
            if not models:
                raise BackendUnavailable(f"{self._server} serves no model")
            self._model = str(models[0]["id"])
        return self._model

    async def healthy(self) -> bool:
        """Whether ``/health`` answers 200 and no weight reload failed on this replica."""
        return self._lost is None and await super().healthy()

    async def _discover_model_dir(self) -> str | None:
        response = await self._admin("GET", "/v1/models", what="listing the served model")
        if response.status_code != 200:
            return None
        models = response.json().get("data") or []
        return str(models[0].get("root")) if models and models[0].get("root") else None

    async def _call(self, method: str, path: str, what: str, **kwargs: Any) -> Any:
        """One management call; a 404 means the dev-mode endpoints are absent."""
        response = await self._admin(method, path, what=what, **kwargs)
        if response.status_code == 404:
            raise FailedPrecondition(
                f"{self._server} has no {path} endpoint: start the vLLM server with VLLM_SERVER_DEV_MODE=1 "
                "(it mounts /pause, /resume, /collective_rpc and /update_weight_version)"
            )
        if response.status_code != 200:
            message = response_message(response)
            raise FailedPrecondition(f"{self._server}: {what} answered {response.status_code}: {message}")
        return response.json()

    async def check_weights(self, path: str) -> str:
        """Check that the server can reload checkpoint ``path`` in place; touches nothing on the server.

        Returns:
            The checkpoint's architecture (e.g. ``Qwen2ForCausalLM``).

        Raises:
            FailedPrecondition: The replica was lost to a failed reload, the server runs without
                ``VLLM_SERVER_DEV_MODE=1``, the checkpoint is unfit (see
                :meth:`~model_proxy.backends._http.HttpBackend._check_local`), or it ties its embeddings.
        """
        if self._lost is not None:
            raise FailedPrecondition(f"{self._server} is lost: {self._lost}; restart it")
        await self._call("GET", "/is_paused", "probing the weight-update endpoints")
        candidate = await self._check_local(path)
        if candidate.tied:
            raise FailedPrecondition(
                f"checkpoint {path!r} ties its input and output embeddings, and vLLM's CPU build cannot reload a "
                "tied output layer in place (it keeps the old weights); serve an untied checkpoint "
                "(tie_word_embeddings false, with an lm_head.weight tensor) or restart the server on the new one"
            )
        return candidate.architecture

    async def load_weights(self, path: str) -> None:
        """Reload the server's weights from checkpoint ``path`` (a directory the server reads too).

        Sequence: :meth:`check_weights`, ``POST /pause?mode=wait`` (returns at once while the proxy's gate
        holds its calls; it waits for any request still in the engine), ``POST /collective_rpc
        reload_weights``, ``POST /update_weight_version`` (the label is ``path``), ``POST /resume``.

        Raises:
            FailedPrecondition: As :meth:`check_weights`; or a step failed. A failed reload (vLLM's engine is
                then broken) marks this replica lost and leaves it paused.
        """
        await self.check_weights(path)
        await self._call("POST", "/pause", "pausing generation", params={"mode": "wait"})
        server_path = await asyncio.to_thread(lambda: str(Path(path).resolve()))
        try:
            await self._call(
                "POST",
                "/collective_rpc",
                "reloading the weights",
                json={"method": "reload_weights", "kwargs": {"weights_path": server_path}},
            )
        except FailedPrecondition as exc:
            self._lost = f"reloading {path!r} failed ({exc.message})"
            raise FailedPrecondition(
                f"{self._server} is lost: {self._lost}; a failed reload leaves vLLM's engine unusable, restart it"
            ) from exc
        self._now_serving(path)
        try:
            await self._call("POST", "/update_weight_version", "labelling the weights", json={"new_version": path})
        finally:
            await self._call("POST", "/resume", "resuming generation")

    async def _body(self, request: GenerationRequest) -> dict[str, Any]:
        sampling = request.sampling
        if not request.prompt_token_ids:
            raise MalformedRequest("the prompt has no tokens")
        body: dict[str, Any] = {
            "model": await self._model_name(),
            "prompt": request.prompt_token_ids,  # a tuple: orjson writes it as an array, with no copy
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "logprobs": 0,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "stop_token_ids": request.stop_token_ids,
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
