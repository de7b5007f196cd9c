"""Unit tests of the vLLM and SGLang clients against small fakes (Starlette apps on loopback ports).

The SGLang fake returns the documented ``/generate`` shape (``meta_info.output_token_logprobs`` as
``[logprob, token_id, text]``, cumulative in stream events); SGLang itself has no CPU build that installs
here. The vLLM client is also tested against a real server in ``integration_tests/test_backend_vllm.py``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from model_proxy.backends._http import sse_events
from model_proxy.backends.sglang import SGLangBackend
from model_proxy.backends.tests.conftest import Serve, unused_port
from model_proxy.backends.vllm import VLLMBackend
from model_proxy.errors import (
    BackendOverloaded,
    BackendTimeout,
    BackendUnavailable,
    ContextLengthExceeded,
    MalformedRequest,
)
from model_proxy.models import GenerationChunk, GenerationRequest, SamplingParams

SAMPLED = [(101, -0.5), (102, -1.25), (103, -2.0), (7, -0.125)]  # 7 is the stop ID


def _sse(events: list[Any]) -> StreamingResponse:
    async def body() -> AsyncIterator[str]:
        for event in events:
            yield f"data: {json.dumps(event)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")


def _error_route(status: int, message: str, headers: dict[str, str] | None = None):
    async def handler(request: Request) -> Response:
        return JSONResponse({"error": {"message": message}}, status_code=status, headers=headers)

    return handler


def _sglang_app(seen: list[dict[str, Any]]) -> Starlette:
    async def generate(request: Request) -> Response:
        body = await request.json()
        seen.append(body)
        n = min(body["sampling_params"]["max_new_tokens"], len(SAMPLED))
        out = SAMPLED[:n]
        finish = {"type": "stop", "matched": 7} if n == len(SAMPLED) else {"type": "length", "length": n}
        entries = [[lp, tid, f"t{tid}"] for tid, lp in out]
        if not body["stream"]:
            meta = {"id": body["rid"], "finish_reason": finish, "output_token_logprobs": entries}
            return JSONResponse({"text": "...", "output_ids": [t for t, _ in out], "meta_info": meta})
        events = [
            {
                "text": "",
                "meta_info": {"finish_reason": None if i < n else finish, "output_token_logprobs": entries[:i]},
            }
            for i in range(1, n + 1)
        ]
        return _sse(events)

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    return Starlette(routes=[Route("/generate", generate, methods=["POST"]), Route("/health", health)])


def _vllm_app(seen: list[dict[str, Any]]) -> Starlette:
    async def completions(request: Request) -> Response:
        body = await request.json()
        seen.append(body)
        out = SAMPLED[: body["max_tokens"]]
        finish = "stop" if len(out) == len(SAMPLED) else "length"
        if not body["stream"]:
            choice = {
                "index": 0, "text": "...", "finish_reason": finish, "token_ids": [t for t, _ in out],
                "logprobs": {"token_logprobs": [lp for _, lp in out], "tokens": ["x"] * len(out)},
            }  # fmt: skip
            return JSONResponse({"choices": [choice]})
        events = [
            {"choices": [{"index": 0, "text": "x", "token_ids": [t], "logprobs": {"token_logprobs": [lp]},
                          "finish_reason": finish if i == len(out) - 1 else None}]}
            for i, (t, lp) in enumerate(out)
        ]  # fmt: skip
        # vLLM repeats the prompt's IDs in its first event (return_token_ids): one long line for a long prompt.
        first = {"choices": [{"index": 0, "text": "", "prompt_token_ids": body["prompt"], "token_ids": []}]}
        return _sse([first, *events])

    async def models(request: Request) -> Response:
        return JSONResponse({"data": [{"id": "served-name"}]})

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]), Route("/v1/models", models)])


def _request(stream: bool, max_tokens: int = 10, prompt: tuple[int, ...] = (1, 2, 3)) -> GenerationRequest:
    return GenerationRequest(
        prompt_token_ids=prompt,
        sampling=SamplingParams(temperature=0.8, top_k=20, max_tokens=max_tokens, seed=5),
        stop_token_ids=(7,),
        request_id="call-9",
        stream=stream,
    )


async def _run(backend: Any, request: GenerationRequest) -> list[GenerationChunk]:
    return [chunk async for chunk in backend.generate(request)]


def _flat(chunks: list[GenerationChunk]) -> tuple[list[int], list[float]]:
    return [t for c in chunks for t in c.token_ids], [p for c in chunks for p in c.logprobs]


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
@pytest.mark.parametrize("stream", [False, True])
async def test_rebuilds_ids_and_logprobs(kind: str, stream: bool, serve: Serve) -> None:
    seen: list[dict[str, Any]] = []
    if kind == "sglang":
        backend: Any = SGLangBackend(await serve(_sglang_app(seen)))
    else:
        backend = VLLMBackend(await serve(_vllm_app(seen)))
    await backend.start()
    try:
        chunks = await _run(backend, _request(stream))
        assert _flat(chunks) == ([t for t, _ in SAMPLED], [lp for _, lp in SAMPLED])
        assert chunks[-1].finish_reason == "stop"
        assert len(chunks) == (4 if stream else 1)
        chunks = await _run(backend, _request(stream, max_tokens=2))
        assert _flat(chunks)[0] == [101, 102]
        assert chunks[-1].finish_reason == "length"
    finally:
        await backend.close()
    body = seen[0]
    if kind == "sglang":
        assert body["input_ids"] == [1, 2, 3]
        assert body["return_logprob"] is True
        assert body["sampling_params"]["stop_token_ids"] == [7]
        assert body["sampling_params"]["sampling_seed"] == 5
        assert body["sampling_params"]["top_k"] == 20
    else:
        assert body["model"] == "served-name"
        assert body["prompt"] == [1, 2, 3]
        assert body["return_token_ids"] is True
        assert body["logprobs"] == 0
        assert body["skip_special_tokens"] is False
        assert body["stop_token_ids"] == [7]
        assert body["seed"] == 5
        assert body["top_k"] == 20


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
@pytest.mark.parametrize("stream", [False, True])
async def test_long_prompt_is_sent_exactly(kind: str, stream: bool, serve: Serve) -> None:
    # A 35k-token prompt: a 200 kB body, and (vLLM, streaming) a first event longer than any read buffer.
    prompt = tuple((i * 7919) % 150000 for i in range(35000))
    seen: list[dict[str, Any]] = []
    app = _sglang_app(seen) if kind == "sglang" else _vllm_app(seen)
    backend: Any = SGLangBackend(await serve(app)) if kind == "sglang" else VLLMBackend(await serve(app))
    await backend.start()
    try:
        for _ in range(2):  # the second call reuses the connection
            chunks = await _run(backend, _request(stream, prompt=prompt))
            assert _flat(chunks) == ([t for t, _ in SAMPLED], [lp for _, lp in SAMPLED])
    finally:
        await backend.close()
    assert [s["input_ids" if kind == "sglang" else "prompt"] for s in seen] == [list(prompt)] * 2


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
@pytest.mark.parametrize(
    ("status", "message", "headers", "error"),
    [
        (429, "too many requests", {"retry-after": "7"}, BackendOverloaded),
        (503, "engine starting", None, BackendUnavailable),
        (500, "boom", None, BackendUnavailable),
        (400, "This model's maximum context length is 2048 tokens. However, you requested 3000", None,
         ContextLengthExceeded),
        (400, "The input (3000 tokens) is longer than the model's context length (2048 tokens).", None,
         ContextLengthExceeded),
        (400, "temperature must be non-negative", None, MalformedRequest),
    ],
)  # fmt: skip
async def test_http_errors_are_mapped(kind: str, status: int, message: str, headers, error, serve: Serve) -> None:
    path = "/generate" if kind == "sglang" else "/v1/completions"
    url = await serve(Starlette(routes=[Route(path, _error_route(status, message, headers), methods=["POST"])]))
    backend: Any = SGLangBackend(url) if kind == "sglang" else VLLMBackend(url, model="m")
    await backend.start()
    try:
        with pytest.raises(error) as info:
            await _run(backend, _request(stream=False))
    finally:
        await backend.close()
    if error is BackendOverloaded:
        assert info.value.retry_after_s == 7.0
    if error is ContextLengthExceeded:
        assert info.value.limit == 2048
        assert info.value.prompt_tokens == 3


def _slow_app() -> Starlette:
    async def handler(request: Request) -> Response:
        await asyncio.sleep(5)
        return Response(status_code=200)

    return Starlette(routes=[Route("/{path:path}", handler, methods=["GET", "POST"])])


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
@pytest.mark.parametrize("failure", ["refused", "slow"])
async def test_transport_errors_are_mapped(kind: str, failure: str, serve: Serve) -> None:
    # "refused": nothing listens on the port; "slow": the server never answers within the read timeout.
    url = f"http://127.0.0.1:{unused_port()}" if failure == "refused" else await serve(_slow_app())
    backend: Any = SGLangBackend(url, timeout_s=0.3) if kind == "sglang" else VLLMBackend(url, model="m", timeout_s=0.3)
    await backend.start()
    try:
        if failure == "refused":
            assert not await backend.healthy()
        with pytest.raises(BackendUnavailable if failure == "refused" else BackendTimeout) as info:
            await _run(backend, _request(stream=True))
        if failure == "refused":
            assert "cannot be reached" in info.value.message
    finally:
        await backend.close()


async def test_not_started_is_unavailable() -> None:
    for backend in (SGLangBackend("http://fake"), VLLMBackend("http://fake", model="m")):
        assert not await backend.healthy()
        with pytest.raises(BackendUnavailable):
            await _run(backend, _request(stream=False))


async def test_sglang_incremental_stream(serve: Serve) -> None:
    entries = [[lp, t, "x"] for t, lp in SAMPLED]

    async def generate(request: Request) -> Response:
        events = [
            {"meta_info": {"finish_reason": None, "output_token_logprobs": entries[:2]}},
            {"meta_info": {"finish_reason": {"type": "stop", "matched": 7}, "output_token_logprobs": entries[2:]}},
        ]
        return _sse(events)

    app = Starlette(routes=[Route("/generate", generate, methods=["POST"])])
    backend = SGLangBackend(await serve(app), incremental_stream=True)
    await backend.start()
    try:
        chunks = await _run(backend, _request(stream=True))
    finally:
        await backend.close()
    assert _flat(chunks)[0] == [t for t, _ in SAMPLED]
    assert [c.finish_reason for c in chunks] == [None, "stop"]


async def test_sse_events_from_arbitrary_chunks() -> None:
    stream = b'data: {"a": 1}\r\n\r\n: a comment\n\ndata: {"b":\ndata: 2}\n\ndata: [DONE]\n\ndata: {"c": 3}\n\n'

    async def chunks(size: int) -> AsyncIterator[bytes]:
        for i in range(0, len(stream), size):
            yield stream[i : i + size]

    for size in (1, 3, 7, len(stream)):
        assert [event async for event in sse_events(chunks(size))] == [{"a": 1}, {"b": 2}]
