"""What the proxy captures over real sockets: streaming does not change it, and a restart does not lose it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from polar.proxy.v1 import model_proxy_service_pb2 as pb
from polar.proxy.v1 import model_proxy_service_pb2_grpc as pb_grpc

from model_proxy.app import ProxyApp
from model_proxy.backends.scripted import ScriptedBackend, ScriptTurn
from model_proxy.server import start_server
from model_proxy.settings import ProxySettings
from polar_core.model_fixtures import build_tiny_tokenizer
from polar_core.server import RunningService

TOOL_TURN = (
    '<think>\nI need the file.\n</think>\n\nReading it.\n<tool_call>\n{"name": "read_file", '
    '"arguments": {"path": "a.py"}}\n</tool_call>'
)
SCRIPT = [ScriptTurn(text=TOOL_TURN), ScriptTurn(text="All done: 42.")]
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}


def _calls() -> dict[str, tuple[str, str, dict[str, Any], dict[str, Any]]]:
    """protocol -> (path, streaming path, body, streaming body); every body offers the read_file tool."""
    anthropic = {
        "model": "policy",
        "max_tokens": 256,
        "system": "sys",
        "tools": [{"name": "read_file", "input_schema": SCHEMA}],
        "messages": [{"role": "user", "content": "read a.py"}],
    }
    chat = {
        "model": "policy",
        "tools": [{"type": "function", "function": {"name": "read_file", "parameters": SCHEMA}}],
        "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "read a.py"}],
    }
    responses = {
        "model": "policy",
        "instructions": "sys",
        "tools": [{"type": "function", "name": "read_file", "parameters": SCHEMA}],
        "input": "read a.py",
    }
    google = {
        "systemInstruction": {"parts": [{"text": "sys"}]},
        "tools": [{"functionDeclarations": [{"name": "read_file", "parametersJsonSchema": SCHEMA}]}],
        "contents": [{"role": "user", "parts": [{"text": "read a.py"}]}],
    }
    g = "/v1beta/models/policy"
    return {
        "anthropic_messages": ("/v1/messages", "/v1/messages", anthropic, {**anthropic, "stream": True}),
        "openai_chat": ("/v1/chat/completions", "/v1/chat/completions", chat, {**chat, "stream": True}),
        "openai_responses": ("/v1/responses", "/v1/responses", responses, {**responses, "stream": True}),
        "google_generate": (f"{g}:generateContent", f"{g}:streamGenerateContent?alt=sse", google, google),
    }


class Stack:
    """A started proxy (HTTP + gRPC) on ``state_dir`` with the scripted backend."""

    def __init__(self, running: RunningService[ProxyApp], channel: grpc.aio.Channel) -> None:
        self.running = running
        self.app = running.app
        self.channel = channel
        self.stub = pb_grpc.ModelProxyServiceStub(channel)
        self.http = httpx.AsyncClient(base_url=self.app.base_url, timeout=30)

    @classmethod
    async def start(cls, state_dir: Path) -> Stack:
        tok = build_tiny_tokenizer()
        eot: Any = tok.convert_tokens_to_ids("<|im_end|>")
        backend = ScriptedBackend(SCRIPT, tok, end_of_turn_id=eot, chunk_size=2)
        settings = ProxySettings(state_dir=state_dir)  # fsync on: the default
        running = await start_server(settings, backend=backend, tokenizer=tok)
        return cls(running, grpc.aio.insecure_channel(f"127.0.0.1:{running.port}"))

    async def stop(self) -> None:
        await self.http.aclose()
        await self.channel.close(None)
        await self.running.stop(None)

    async def token(self, session_id: str) -> str:
        reply = await self.stub.OpenSession(pb.OpenSessionRequest(session_id=session_id, model="policy"))
        token: str = reply.session_token
        return token

    async def completions(self, session_id: str) -> list[Any]:
        reply = await self.stub.ListCompletions(pb.ListCompletionsRequest(session_id=session_id))
        return list(reply.completions)

    async def post(self, path: str, body: dict[str, Any], token: str, stream: bool) -> None:
        headers = {"x-api-key": token}
        if stream:
            async with self.http.stream("POST", path, json=body, headers=headers) as response:
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/event-stream")
                async for _ in response.aiter_bytes():
                    pass
        else:
            response = await self.http.post(path, json=body, headers=headers)
            assert response.status_code == 200, response.text


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    s = await Stack.start(tmp_path)
    try:
        yield s
    finally:
        await s.stop()


@pytest.mark.parametrize("protocol", list(_calls()))
async def test_streaming_does_not_change_what_is_captured(stack: Stack, protocol: str) -> None:
    path, stream_path, body, stream_body = _calls()[protocol]
    await stack.post(path, body, await stack.token("plain"), stream=False)
    await stack.post(stream_path, stream_body, await stack.token("streamed"), stream=True)
    (plain,) = await stack.completions("plain")
    (streamed,) = await stack.completions("streamed")
    assert plain.protocol == streamed.protocol == protocol
    assert list(plain.prompt_token_ids) == list(streamed.prompt_token_ids)
    assert len(plain.response_token_ids) > 5
    assert list(plain.response_token_ids) == list(streamed.response_token_ids)
    assert list(plain.response_logprobs) == list(streamed.response_logprobs)
    assert plain.finish_reason == streamed.finish_reason == "tool_calls"
    for record in (plain, streamed):
        for call in record.response["tool_calls"]:
            del call["id"]
    assert plain.response == streamed.response
    assert plain.response["text"] == "Reading it."


async def test_a_restart_loses_no_finished_call(tmp_path: Path) -> None:
    path, stream_path, body, stream_body = _calls()["openai_chat"]
    first = await Stack.start(tmp_path)
    try:
        token = await first.token("agent")
        await first.post(path, body, token, stream=False)
        await first.post(stream_path, stream_body, await first.token("other"), stream=True)
        before = {sid: await first.completions(sid) for sid in ("agent", "other")}
    finally:
        await first.stop()

    second = await Stack.start(tmp_path)
    try:
        after = {sid: await second.completions(sid) for sid in ("agent", "other")}
        assert after == before
        assert [len(v) for v in after.values()] == [1, 1]
        # The old token still authenticates; the next call continues the session's seq and extends its prompt.
        follow_up = {
            **body,
            "messages": [
                *body["messages"],
                {"role": "assistant", "content": "Reading it.", "reasoning_content": "I need the file."},
                {"role": "user", "content": "go on"},
            ],
        }
        await second.post(path, follow_up, token, stream=False)
        records = await second.completions("agent")
        assert [r.seq for r in records] == [0, 1]
        assert records[0] == before["agent"][0]
        old = list(records[0].prompt_token_ids)
        assert list(records[1].prompt_token_ids[: len(old)]) == old
    finally:
        await second.stop()
