from __future__ import annotations

import json
from typing import Any

import pytest

from polar_core.model_fixtures import (
    DEFAULT_SYSTEM_PROMPT,
    build_tiny_tokenizer,
    chat_template_renders_tools,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_command",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    },
]

CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a weather bot."},
    {"role": "user", "content": "What's the weather in Paris and Oslo?"},
    {
        "role": "assistant",
        "content": None,
        "reasoning_content": "I need two lookups.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            },
            {
                "id": "call_2",
                "type": "function",
                # OpenAI wire format: arguments as a JSON string.
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "rain, 9 C"},
    {"role": "assistant", "content": "Paris is sunny; Oslo is rainy.", "reasoning_content": "Summarize."},
    {"role": "user", "content": [{"type": "text", "text": "Now list files."}]},
    {
        "role": "assistant",
        "content": "Listing.",
        "tool_calls": [{"function": {"name": "run_command", "arguments": {"command": "ls -la"}}}],
    },
    {"role": "tool", "content": "a.py\nb.py"},
    {"role": "assistant", "content": "Two files: a.py and b.py."},
]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def _render(tokenizer, messages, *, tools=TOOLS, add_generation_prompt: bool) -> str:
    text = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    assert isinstance(text, str)
    return text


def _ids(tokenizer, messages, *, tools=TOOLS, add_generation_prompt: bool) -> list[int]:
    ids = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
    )
    assert isinstance(ids, list)
    return ids


def test_renders_exact_qwen25_layout(tokenizer) -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "sunny"},
    ]
    expected = (
        "<|im_start|>system\n"
        f"{DEFAULT_SYSTEM_PROMPT}\n\n"
        "# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        "<tools>\n"
        f"{json.dumps(TOOLS[0])}\n"
        "</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n"
        "<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert _render(tokenizer, messages, tools=TOOLS[:1], add_generation_prompt=True) == expected


def test_renders_without_tools(tokenizer) -> None:
    text = _render(tokenizer, [{"role": "user", "content": "hi"}], tools=None, add_generation_prompt=False)
    assert text == f"<|im_start|>system\n{DEFAULT_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"


def test_conversation_contains_every_marker(tokenizer) -> None:
    text = _render(tokenizer, CONVERSATION, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a weather bot.\n\n# Tools\n")
    assert text.count("<|im_start|>system") == 1
    for tool in TOOLS:
        assert json.dumps(tool) in text
    assert "<|im_start|>assistant\n<think>\nI need two lookups.\n</think>\n\n<tool_call>\n" in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n' in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>' in text
    # Consecutive tool results share one user turn.
    assert (
        "<|im_start|>user\n<tool_response>\nsunny, 21 C\n</tool_response>\n"
        "<tool_response>\nrain, 9 C\n</tool_response><|im_end|>\n"
    ) in text
    assert "<think>\nSummarize.\n</think>\n\nParis is sunny; Oslo is rainy.<|im_end|>" in text
    assert "<|im_start|>user\nNow list files.<|im_end|>" in text
    assert 'Listing.\n<tool_call>\n{"name": "run_command", "arguments": {"command": "ls -la"}}' in text
    assert text.endswith("Two files: a.py and b.py.<|im_end|>\n<|im_start|>assistant\n")


def test_tokenized_render_matches_encoding_the_text(tokenizer) -> None:
    text = _render(tokenizer, CONVERSATION, add_generation_prompt=True)
    ids = _ids(tokenizer, CONVERSATION, add_generation_prompt=True)
    assert ids == tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text


@pytest.mark.parametrize("with_tools", [True, False])
def test_rendering_is_append_only_at_assistant_turns(tokenizer, with_tools: bool) -> None:
    tools = TOOLS if with_tools else None
    full_ids = _ids(tokenizer, CONVERSATION, tools=tools, add_generation_prompt=False)
    assistant_turns = [k for k, message in enumerate(CONVERSATION) if message["role"] == "assistant"]
    assert len(assistant_turns) == 4
    for k in assistant_turns:
        prompt_ids = _ids(tokenizer, CONVERSATION[:k], tools=tools, add_generation_prompt=True)
        for end in range(k + 1, len(CONVERSATION) + 1):
            longer = _ids(tokenizer, CONVERSATION[:end], tools=tools, add_generation_prompt=False)
            assert longer[: len(prompt_ids)] == prompt_ids, (k, end)
        assert full_ids[: len(prompt_ids)] == prompt_ids
        # The appended assistant turn ends with <|im_end|>, the token a policy samples to stop.
        turn = _ids(tokenizer, CONVERSATION[: k + 1], tools=tools, add_generation_prompt=False)
        assert turn[len(prompt_ids) :][-2:] == tokenizer.encode("<|im_end|>\n", add_special_tokens=False)


def test_template_renders_tools_probe(tokenizer) -> None:
    assert chat_template_renders_tools(tokenizer)
