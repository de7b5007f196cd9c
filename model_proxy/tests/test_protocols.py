from __future__ import annotations

import pytest

from model_proxy.errors import MalformedRequest
from model_proxy.protocols import AnthropicAdapter, GoogleAdapter, OpenAIChatAdapter, OpenAIResponsesAdapter


def test_anthropic_system_blocks_tool_results_and_thinking() -> None:
    body = {
        "model": "m",
        "max_tokens": 50,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=abc;"},
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "fix it"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "text", "text": "Reading."},
                    {"type": "tool_use", "id": "tu1", "name": "Read", "input": {"path": "a"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "tu1", "content": [{"type": "text", "text": "data"}]},
                    {"type": "text", "text": "go on"},
                ],
            },
            {"role": "system", "content": "reminder"},
        ],
        "tools": [
            {"name": "Read", "description": "read", "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search"},
        ],
        "stop_sequences": ["END"],
        "temperature": 0.7,
        "thinking": {"type": "enabled", "budget_tokens": 100},
        "context_management": {"x": 1},
    }
    req = AnthropicAdapter().parse(body).internal
    roles = [m.role for m in req.messages]
    assert roles == ["system", "user", "assistant", "tool", "user", "system"]
    assert req.messages[0].content.endswith("You are Claude Code.")
    assert req.messages[2].reasoning == "hmm"
    assert req.messages[2].tool_calls[0].arguments == {"path": "a"}
    assert req.messages[3].content == "data"
    assert req.messages[3].name == "Read"
    assert [t.name for t in req.tools] == ["Read"]
    assert req.normalized["ignored"] == ["tool web_search (web_search_20250305)"]
    assert req.sampling.stop == ("END",)
    assert req.sampling.temperature == 0.7
    assert req.sampling.max_tokens == 50


def test_openai_chat_tool_results_as_part_lists_and_developer_role() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "developer", "content": "be good"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"d": "."}'}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "x.py"}]},
        ],
        "tools": [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}],
        "stop": "STOP",
        "max_completion_tokens": 9,
    }
    req = OpenAIChatAdapter().parse(body).internal
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "tool"]
    assert req.messages[1].content == "ab"
    assert req.messages[2].tool_calls[0].arguments == {"d": "."}
    assert req.messages[3].content == "x.py"
    assert req.messages[3].name == "ls"
    assert req.sampling.stop == ("STOP",)
    assert req.sampling.max_tokens == 9


def test_openai_chat_rejects_bad_arguments_and_n() -> None:
    with pytest.raises(MalformedRequest):
        OpenAIChatAdapter().parse({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 2})
    bad = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}
    with pytest.raises(MalformedRequest):
        OpenAIChatAdapter().parse({"model": "m", "messages": [{"role": "assistant", "tool_calls": [bad]}]})


def test_responses_codex_shapes() -> None:
    body = {
        "model": "m",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
            {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}], "encrypted_content": "full"},
            {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": '{"cmd": "ls"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "a.py"},
            {"type": "function_call", "call_id": "c2", "name": "read", "namespace": "mcp__fs", "arguments": "{}"},
            {"type": "web_search_call", "id": "w"},
        ],
        "tools": [
            {"type": "function", "name": "shell", "parameters": {"type": "object"}},
            {"type": "namespace", "name": "mcp__fs", "tools": [{"type": "function", "name": "read", "parameters": {}}]},
            {"type": "web_search"},
            {"type": "custom", "name": "apply_patch", "description": "patch"},
        ],
        "include": ["reasoning.encrypted_content"],
        "reasoning": {"effort": "high"},
        "prompt_cache_key": "k",
    }
    parsed = OpenAIResponsesAdapter().parse(body)
    req = parsed.internal
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert req.messages[2].reasoning == "full"
    assert req.messages[3].name == "shell"
    assert req.messages[4].tool_calls[0].name == "mcp__fs__read"
    assert [t.name for t in req.tools] == ["shell", "mcp__fs__read", "apply_patch"]
    assert "tool web_search" in req.normalized["ignored"]
    assert "input item web_search_call" in req.normalized["ignored"]


def test_google_schemas_and_function_responses() -> None:
    body = {
        "systemInstruction": {"parts": [{"text": "sys"}]},
        "contents": [
            {"role": "user", "parts": [{"text": "hi"}]},
            {
                "role": "model",
                "parts": [
                    {"text": "plan", "thought": True},
                    {"functionCall": {"name": "ls", "args": {"d": "."}}, "thoughtSignature": "xx"},
                ],
            },
            {
                "role": "user",
                "parts": [{"functionResponse": {"id": "cli-1", "name": "ls", "response": {"output": "a"}}}],
            },
        ],
        "tools": [
            {
                "functionDeclarations": [
                    {"name": "ls", "parametersJsonSchema": {"type": "object", "properties": {"d": {"type": "string"}}}},
                    {"name": "cat", "parameters": {"type": "OBJECT", "properties": {"p": {"type": "STRING"}}}},
                ]
            },
            {"googleSearch": {}},
        ],
        "generationConfig": {"temperature": 0.5, "maxOutputTokens": 7, "stopSequences": ["X"]},
    }
    req = GoogleAdapter().parse(body, path_model="gemini", path_stream=True).internal
    assert req.model == "gemini"
    assert req.stream
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "tool"]
    assert req.messages[2].reasoning == "plan"
    assert req.messages[2].tool_calls[0].arguments == {"d": "."}
    assert req.messages[3].content == "a"
    assert req.messages[3].tool_call_id == "cli-1"
    assert req.tools[1].parameters == {"type": "object", "properties": {"p": {"type": "string"}}}
    assert req.sampling.max_tokens == 7
    assert req.sampling.stop == ("X",)
    assert req.normalized["ignored"] == ["tool googleSearch"]
