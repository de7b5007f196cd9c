"""The model proxy over real sockets: gRPC sessions, official provider SDKs as clients, scripted backend."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import grpc
import openai
import pytest
from google import genai
from google.genai import types as genai_types
from google.protobuf import json_format
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
TEXT_TURN = "All done: 42."
SCRIPT = [ScriptTurn(text=TOOL_TURN), ScriptTurn(text=TEXT_TURN)]
READ_FILE = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}


class ProxyStack:
    """A started proxy (HTTP + gRPC) and a gRPC stub to drive it."""

    def __init__(self, app: ProxyApp, stub: Any, backend: ScriptedBackend) -> None:
        self.app = app
        self.stub = stub
        self.backend = backend
        self.clients: list[Any] = []

    def keep(self, client: Any) -> Any:
        """Remember an SDK client so the fixture closes it."""
        self.clients.append(client)
        return client

    async def close_clients(self) -> None:
        for client in self.clients:
            if isinstance(client, genai.Client):
                await client.aio.aclose()
            else:
                await client.close()

    async def open(self, session_id: str) -> pb.OpenSessionResponse:
        reply: pb.OpenSessionResponse = await self.stub.OpenSession(
            pb.OpenSessionRequest(session_id=session_id, model="policy")
        )
        return reply

    async def completions(self, session_id: str) -> list[Any]:
        reply = await self.stub.ListCompletions(pb.ListCompletionsRequest(session_id=session_id))
        return list(reply.completions)


async def start_proxy_stack(
    state_dir: Path, script: list[ScriptTurn]
) -> tuple[ProxyStack, RunningService[ProxyApp], grpc.aio.Channel]:
    """Start the proxy (HTTP API and gRPC) on port 0; returns the stack, the running service and a channel."""
    tok = build_tiny_tokenizer()
    eot: Any = tok.convert_tokens_to_ids("<|im_end|>")
    backend = ScriptedBackend(script, tok, end_of_turn_id=eot, chunk_size=3)
    running = await start_server(ProxySettings(state_dir=state_dir), backend=backend, tokenizer=tok)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
    return ProxyStack(running.app, pb_grpc.ModelProxyServiceStub(channel), backend), running, channel


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[ProxyStack]:
    proxy, running, channel = await start_proxy_stack(tmp_path, SCRIPT)
    try:
        yield proxy
    finally:
        await proxy.close_clients()
        await channel.close(None)
        await running.stop(None)


def _check_records(records: list[Any], protocol: str) -> None:
    assert [r.seq for r in records] == [0, 1]
    first, second = records
    assert first.protocol == protocol
    assert first.finish_reason == "tool_calls"
    assert second.finish_reason == "stop"
    assert len(first.response_token_ids) == len(first.response_logprobs) > 0
    # The follow-up prompt starts with the first call's exact prompt (prefix-merge friendly).
    assert list(second.prompt_token_ids[: len(first.prompt_token_ids)]) == list(first.prompt_token_ids)
    assert second.parent_call_id == first.call_id


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_chat_sdk(stack: ProxyStack, stream: bool) -> None:
    opened = await stack.open("chat")
    client = stack.keep(
        openai.AsyncOpenAI(base_url=opened.openai_base_url, api_key=opened.session_token, max_retries=0)
    )
    tools: Any = [{"type": "function", "function": {"name": "read_file", "parameters": READ_FILE}}]
    messages: list[Any] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "read a.py"}]
    if stream:
        calls: dict[int, Any] = {}
        finish = None
        chunks = await client.chat.completions.create(model="policy", messages=messages, tools=tools, stream=True)
        async for chunk in chunks:
            choice = chunk.choices[0]
            for tc in choice.delta.tool_calls or []:
                calls[tc.index] = tc
            finish = choice.finish_reason or finish
        assert finish == "tool_calls"
        call = calls[0]
        call_id, name, args = call.id, call.function.name, call.function.arguments
    else:
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=tools)
        assert reply.choices[0].finish_reason == "tool_calls"
        tc = reply.choices[0].message.tool_calls[0]
        call_id, name, args = tc.id, tc.function.name, tc.function.arguments
        assert reply.choices[0].message.content == "Reading it."
    assert (name, json.loads(args)) == ("read_file", {"path": "a.py"})
    messages += [
        {
            "role": "assistant",
            "content": "Reading it.",
            "reasoning_content": "I need the file.",
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}],
        },
        {"role": "tool", "tool_call_id": call_id, "content": [{"type": "text", "text": "print(42)"}]},
    ]
    reply = await client.chat.completions.create(model="policy", messages=messages, tools=tools)
    assert reply.choices[0].message.content == TEXT_TURN
    assert reply.usage is not None
    assert reply.usage.completion_tokens > 0
    _check_records(await stack.completions("chat"), "openai_chat")


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_responses_sdk(stack: ProxyStack, stream: bool) -> None:
    opened = await stack.open("resp")
    client = stack.keep(
        openai.AsyncOpenAI(base_url=opened.openai_base_url, api_key=opened.session_token, max_retries=0)
    )
    tools: Any = [
        {"type": "function", "name": "read_file", "parameters": READ_FILE, "strict": False},
        {"type": "web_search"},
    ]
    inputs: list[Any] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sys"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "read a.py"}]},
    ]
    include: Any = ["reasoning.encrypted_content"]
    if stream:
        kinds = []
        response = None
        events = await client.responses.create(model="policy", input=inputs, tools=tools, stream=True, include=include)
        async for event in events:
            kinds.append(event.type)
            if event.type == "response.completed":
                response = event.response
        assert kinds[0] == "response.created"
        assert kinds[-1] == "response.completed"
        assert "response.output_item.added" in kinds
        assert "response.function_call_arguments.delta" in kinds
        assert response is not None
    else:
        response = await client.responses.create(model="policy", input=inputs, tools=tools, include=include)
    items = {item.type: item for item in response.output}
    assert set(items) == {"reasoning", "message", "function_call"}
    call = items["function_call"]
    assert (call.name, json.loads(call.arguments)) == ("read_file", {"path": "a.py"})
    replay = [item.model_dump(exclude_none=True) for item in response.output]
    inputs += [*replay, {"type": "function_call_output", "call_id": call.call_id, "output": "print(42)"}]
    final = await client.responses.create(model="policy", input=inputs, tools=tools)
    assert final.output_text == TEXT_TURN
    records = await stack.completions("resp")
    _check_records(records, "openai_responses")
    assert "tool web_search" in json.dumps(json_format.MessageToDict(records[0].request))


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_sdk(stack: ProxyStack, stream: bool) -> None:
    opened = await stack.open("claude")
    client = stack.keep(
        anthropic.AsyncAnthropic(base_url=opened.anthropic_base_url, api_key=opened.session_token, max_retries=0)
    )
    tools: Any = [{"name": "read_file", "description": "Read a file.", "input_schema": READ_FILE}]
    system: Any = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.0; cch=123;"},
        {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}},
    ]
    messages: list[Any] = [{"role": "user", "content": "read a.py"}]
    if stream:
        async with client.messages.stream(
            model="policy", max_tokens=200, system=system, messages=messages, tools=tools
        ) as s:
            message = await s.get_final_message()
    else:
        message = await client.messages.create(
            model="policy", max_tokens=200, system=system, messages=messages, tools=tools
        )
    assert message.stop_reason == "tool_use"
    kinds = [block.type for block in message.content]
    assert kinds == ["thinking", "text", "tool_use"]
    tool_use = message.content[2]
    assert tool_use.type == "tool_use"
    assert tool_use.input == {"path": "a.py"}
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": tool_use.id, "content": [{"type": "text", "text": "print(42)"}]}
            ],
        },
    ]
    system[0]["text"] = "x-anthropic-billing-header: cc_version=2.0; cch=456;"  # changes every call
    final = await client.messages.create(model="policy", max_tokens=200, system=system, messages=messages, tools=tools)
    assert final.content[0].type == "text"
    assert final.content[0].text == TEXT_TURN
    records = await stack.completions("claude")
    _check_records(records, "anthropic_messages")
    assert list(records[1].normalization_rules_fired) == ["strip_anthropic_billing_header"]


@pytest.mark.parametrize("stream", [False, True])
async def test_google_genai_sdk(stack: ProxyStack, stream: bool) -> None:
    opened = await stack.open("gemini")
    client = stack.keep(
        genai.Client(
            api_key=opened.session_token, http_options=genai_types.HttpOptions(base_url=opened.google_base_url)
        )
    )
    decl = genai_types.FunctionDeclaration(
        name="read_file", description="Read a file.", parameters_json_schema=READ_FILE
    )
    config = genai_types.GenerateContentConfig(
        system_instruction="sys",
        tools=[genai_types.Tool(function_declarations=[decl])],
        automatic_function_calling=genai_types.AutomaticFunctionCallingConfig(disable=True),
    )
    contents: list[Any] = [genai_types.Content(role="user", parts=[genai_types.Part(text="read a.py")])]
    parts: list[Any] = []
    if stream:
        finish = None
        async for chunk in await client.aio.models.generate_content_stream(
            model="policy", contents=contents, config=config
        ):
            candidate = chunk.candidates[0]
            parts += candidate.content.parts or []
            finish = candidate.finish_reason or finish
        assert finish == genai_types.FinishReason.STOP
    else:
        reply = await client.aio.models.generate_content(model="policy", contents=contents, config=config)
        parts = reply.candidates[0].content.parts
    calls = [p.function_call for p in parts if p.function_call]
    assert [(c.name, c.args) for c in calls] == [("read_file", {"path": "a.py"})]
    thought = "".join(p.text for p in parts if p.thought and p.text)
    assert thought == "I need the file."
    model_parts = [
        genai_types.Part(text=thought, thought=True),
        genai_types.Part(text="Reading it."),
        genai_types.Part(function_call=calls[0]),
    ]
    contents += [
        genai_types.Content(role="model", parts=model_parts),
        genai_types.Content(
            role="user",
            parts=[
                genai_types.Part(
                    function_response=genai_types.FunctionResponse(name="read_file", response={"output": "print(42)"})
                )
            ],
        ),
    ]
    final = await client.aio.models.generate_content(model="policy", contents=contents, config=config)
    assert final.text == TEXT_TURN
    _check_records(await stack.completions("gemini"), "google_generate")


async def test_grpc_session_lifecycle_and_errors(stack: ProxyStack) -> None:
    opened = await stack.open("life")
    again = await stack.open("life")
    assert again.session_token == opened.session_token
    client = stack.keep(openai.AsyncOpenAI(base_url=opened.openai_base_url, api_key="wrong", max_retries=0))
    with pytest.raises(openai.AuthenticationError):
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(grpc.aio.AioRpcError) as refused:  # a label would read back as the initial version
        await stack.stub.SetPolicyVersion(pb.SetPolicyVersionRequest(policy_version="v2"))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    previous = await stack.stub.SetPolicyVersion(pb.SetPolicyVersionRequest(policy_version="2"))
    assert previous.previous_policy_version == "0"
    policy = await stack.stub.GetPolicy(pb.GetPolicyRequest())
    assert policy.policy_version == "2"
    watch = stack.stub.WatchCompletions(pb.WatchCompletionsRequest(session_id="life", from_seq=0))
    client = stack.keep(
        openai.AsyncOpenAI(base_url=opened.openai_base_url, api_key=opened.session_token, max_retries=0)
    )
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
    closed = await stack.stub.CloseSession(pb.CloseSessionRequest(session_id="life"))
    assert closed.completions == 1
    seen = [item.completion async for item in watch]
    assert [c.policy_version for c in seen] == ["2"]
    with pytest.raises(openai.AuthenticationError):
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stack.stub.ListCompletions(pb.ListCompletionsRequest(session_id="nope"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stack.open("life")
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    paused = await stack.stub.PauseGeneration(pb.PauseGenerationRequest())
    assert paused.in_flight == 0
    resumed = await stack.stub.ResumeGeneration(pb.ResumeGenerationRequest())
    assert resumed.released == 0
    await asyncio.sleep(0)
