"""Abort mode: a call in flight when ``PauseGeneration(abort_in_flight=True)`` runs, seen through the official SDKs.

The harness must get its provider's *retryable* error, never the partial answer: a plain status when the cut
comes before the stream began (Anthropic 529 ``overloaded_error``, OpenAI 503 ``server_error``, Google 503
``UNAVAILABLE``), an error event in the provider's stream shape after. The cut call's record says
``finish_reason`` ``abort`` and the reconstructor leaves it out of every trace.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anthropic
import grpc
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types
from polar.proxy.v1 import model_proxy_service_pb2 as pb
from polar.proxy.v1 import model_proxy_service_pb2_grpc as pb_grpc

from model_proxy.backends.scripted import ScriptedBackend, ScriptTurn
from model_proxy.models import GenerationChunk, GenerationRequest
from model_proxy.server import start_server
from model_proxy.settings import ProxySettings
from polar_core.convert import completion_from_proto
from polar_core.model_fixtures import build_tiny_tokenizer
from reconstructor.core import reconstruct_session

CUT_TEXT = "This answer will be cut off before it ends."
RETRY_TEXT = "All done: 42."


class HeldBackend(ScriptedBackend):
    """A scripted backend whose calls can be held before their chunk number ``hold_at`` (none: ``None``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hold_at: int | None = None
        self.reached = asyncio.Event()
        self.release = asyncio.Event()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        index = 0
        async for chunk in super().generate(request):
            if index == self.hold_at:
                self.reached.set()
                await self.release.wait()
            yield chunk
            index += 1


class Stack:
    """A proxy over a :class:`HeldBackend`, with its gRPC stub."""

    def __init__(self, running: Any, channel: grpc.aio.Channel, backend: HeldBackend) -> None:
        self.running = running
        self.channel = channel
        self.stub: Any = pb_grpc.ModelProxyServiceStub(channel)
        self.backend = backend

    async def open(self, session_id: str) -> Any:
        return await self.stub.OpenSession(pb.OpenSessionRequest(session_id=session_id, model="policy"))

    async def cut_while_held(self, call: Awaitable[Any]) -> asyncio.Task[Any]:
        """Start ``call``, wait until the backend holds it, abort it with PauseGeneration; stays paused."""
        task = asyncio.ensure_future(call)
        await asyncio.wait_for(self.backend.reached.wait(), 30)
        reply = await self.stub.PauseGeneration(pb.PauseGenerationRequest(abort_in_flight=True))
        assert (reply.in_flight, reply.aborted) == (1, 1)
        self.backend.hold_at = None
        return task

    async def resume(self) -> None:
        await self.stub.ResumeGeneration(pb.ResumeGenerationRequest())

    async def check_records(self, session_id: str) -> None:
        """The cut call is recorded as ``abort``, the retry as a normal answer, and only the retry is traced."""
        reply = await self.stub.ListCompletions(pb.ListCompletionsRequest(session_id=session_id))
        records = [completion_from_proto(c) for c in reply.completions]
        assert [r.finish_reason for r in records] == ["abort", "stop"]
        cut, retried = records
        result = reconstruct_session(records)
        assert result.stats.aborted_calls == 1
        assert result.stats.calls == result.stats.chains + result.stats.merges + result.stats.aborted_calls
        traced = [t for trace in result.traces for t in trace.response_token_ids]
        assert traced == list(retried.response_token_ids)
        text = build_tiny_tokenizer().decode(traced)
        assert "cut off" not in text
        assert len(cut.response_token_ids) == len(cut.response_logprobs)


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    tok = build_tiny_tokenizer()
    eot: Any = tok.convert_tokens_to_ids("<|im_end|>")
    script = [ScriptTurn(text=CUT_TEXT), ScriptTurn(text=RETRY_TEXT)]
    backend = HeldBackend(script, tok, end_of_turn_id=eot, chunk_size=3)
    running = await start_server(ProxySettings(state_dir=tmp_path, retry_after_s=0.1), backend=backend, tokenizer=tok)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
    try:
        yield Stack(running, channel, backend)
    finally:
        await channel.close(None)
        await running.stop(None)


MESSAGES: Any = [{"role": "user", "content": "hello"}]


async def _openai_chat(opened: Any, retries: int) -> str:
    async with openai.AsyncOpenAI(
        base_url=opened.openai_base_url, api_key=opened.session_token, max_retries=retries
    ) as client:
        stream = await client.chat.completions.create(model="policy", messages=MESSAGES, stream=True)
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])


async def _openai_responses(opened: Any, retries: int) -> str:
    async with openai.AsyncOpenAI(
        base_url=opened.openai_base_url, api_key=opened.session_token, max_retries=retries
    ) as client:
        stream = await client.responses.create(model="policy", input="hello", stream=True)
        return "".join([e.delta async for e in stream if e.type == "response.output_text.delta"])


async def _anthropic(opened: Any, retries: int) -> str:
    async with anthropic.AsyncAnthropic(
        base_url=opened.anthropic_base_url, api_key=opened.session_token, max_retries=retries
    ) as client:
        stream = await client.messages.create(model="policy", max_tokens=64, messages=MESSAGES, stream=True)
        parts = [e.delta.text async for e in stream if e.type == "content_block_delta" and e.delta.type == "text_delta"]
        return "".join(parts)


async def _google(opened: Any, retries: int) -> str:
    options = genai_types.HttpOptions(base_url=opened.google_base_url)
    client = genai.Client(api_key=opened.session_token, http_options=options)
    try:
        stream = await client.aio.models.generate_content_stream(model="policy", contents="hello")
        return "".join([chunk.text or "" async for chunk in stream])
    finally:
        await client.aio.aclose()


def _openai_error(exc: BaseException) -> None:
    assert isinstance(exc, openai.InternalServerError)
    assert exc.status_code == 503
    assert isinstance(exc.body, dict)
    assert exc.body["type"] == "server_error"


def _anthropic_error(exc: BaseException) -> None:
    assert isinstance(exc, anthropic.OverloadedError)
    assert exc.status_code == 529
    assert isinstance(exc.body, dict)
    assert exc.body["error"]["type"] == "overloaded_error"


def _google_error(exc: BaseException) -> None:
    assert isinstance(exc, genai_errors.ServerError)
    assert (exc.code, exc.status) == (503, "UNAVAILABLE")


CLIENTS: dict[str, tuple[Callable[[Any, int], Awaitable[str]], Callable[[BaseException], None]]] = {
    "openai_chat": (_openai_chat, _openai_error),
    "openai_responses": (_openai_responses, _openai_error),
    "anthropic": (_anthropic, _anthropic_error),
    "google": (_google, _google_error),
}


@pytest.mark.parametrize("provider", list(CLIENTS))
async def test_cut_before_the_stream_is_a_retryable_status(stack: Stack, provider: str) -> None:
    call, check_error = CLIENTS[provider]
    opened = await stack.open(provider)
    stack.backend.hold_at = 0
    task = await stack.cut_while_held(call(opened, 0))
    with pytest.raises(Exception) as info:  # noqa: PT011 - each provider's own type, checked just below
        await task
    check_error(info.value)
    await stack.resume()
    assert await call(opened, 0) == RETRY_TEXT
    await stack.check_records(provider)


@pytest.mark.parametrize("provider", ["openai_chat", "anthropic"])
async def test_the_sdk_retries_by_itself_once_generation_resumes(stack: Stack, provider: str) -> None:
    call, _ = CLIENTS[provider]
    opened = await stack.open(provider)
    stack.backend.hold_at = 0
    task = await stack.cut_while_held(call(opened, 3))
    await asyncio.sleep(0.3)  # the SDK's retry is now held at the paused gate (or about to be)
    assert not task.done()
    await stack.resume()
    assert await asyncio.wait_for(task, 30) == RETRY_TEXT
    await stack.check_records(provider)


async def test_cut_mid_stream_is_an_openai_error_chunk(stack: Stack) -> None:
    opened = await stack.open("mid-openai")
    stack.backend.hold_at = 1
    seen: list[str] = []

    async def consume() -> None:
        async with openai.AsyncOpenAI(
            base_url=opened.openai_base_url, api_key=opened.session_token, max_retries=0
        ) as client:
            stream = await client.chat.completions.create(model="policy", messages=MESSAGES, stream=True)
            async for chunk in stream:
                seen.append(chunk.choices[0].delta.content or "" if chunk.choices else "")

    task = await stack.cut_while_held(consume())
    with pytest.raises(openai.APIError) as info:
        await task
    assert isinstance(info.value.body, dict)
    assert info.value.body["type"] == "server_error"
    assert "".join(seen)  # the first chunk arrived ...
    assert "".join(seen) != CUT_TEXT  # ... the whole answer did not
    await stack.resume()
    assert await _openai_chat(opened, 0) == RETRY_TEXT
    await stack.check_records("mid-openai")


async def test_cut_mid_stream_is_an_anthropic_error_event(stack: Stack) -> None:
    opened = await stack.open("mid-anthropic")
    stack.backend.hold_at = 1

    async def consume() -> None:
        async with anthropic.AsyncAnthropic(
            base_url=opened.anthropic_base_url, api_key=opened.session_token, max_retries=0
        ) as client:
            stream = await client.messages.create(model="policy", max_tokens=64, messages=MESSAGES, stream=True)
            async for _ in stream:
                pass

    task = await stack.cut_while_held(consume())
    with pytest.raises(anthropic.APIStatusError) as info:
        await task
    assert isinstance(info.value.body, dict)
    assert info.value.body["error"]["type"] == "overloaded_error"
    await stack.resume()
    assert await _anthropic(opened, 0) == RETRY_TEXT
    await stack.check_records("mid-anthropic")
