from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from model_proxy.core.render import ChatRenderer, PrefixCache
from model_proxy.core.types import ChatMessage, ToolCall, ToolSpec
from polar_core.model_fixtures import build_tiny_tokenizer

_PIECES = [*"ab xyz\n\t  é東🙂.,:{}\"'<>|_", "<|im_end|>", "<|im_start|>", "<tool_call>", "</think>", "\n\n"]
_TEXT = st.lists(st.sampled_from(_PIECES), max_size=25).map("".join)
_TOOLS = [ToolSpec("read_file", "Read a file.", {"type": "object", "properties": {"path": {"type": "string"}}})]


@st.composite
def _message(draw: st.DrawFn) -> ChatMessage:
    role = draw(st.sampled_from(["user", "assistant", "tool", "system"]))
    text = draw(_TEXT)
    if role == "assistant":
        calls = [ToolCall("c1", "read_file", {"path": draw(_TEXT)})] if draw(st.booleans()) else []
        return ChatMessage("assistant", text, tool_calls=calls, reasoning=draw(st.one_of(st.none(), _TEXT)))
    if role == "tool":
        return ChatMessage("tool", text, tool_call_id="c1", name="read_file")
    return ChatMessage(role, text)  # type: ignore[arg-type]


@settings(max_examples=120, deadline=None)
@given(
    system=_TEXT,
    turns=st.lists(_message(), min_size=1, max_size=8),
    tools=st.booleans(),
    branch=st.integers(0, 7),
)
def test_incremental_tokenisation_equals_full_tokenisation(
    tokenizer, system: str, turns: list[ChatMessage], tools: bool, branch: int
) -> None:
    renderer = ChatRenderer(tokenizer)
    assert renderer.incremental
    cache = PrefixCache(4)
    messages = [ChatMessage("system", system), *turns]
    specs = _TOOLS if tools else []
    # A growing conversation (the agent loop), then a branch that rewrites an earlier turn.
    prompts = [messages[: n + 1] for n in range(1, len(messages))]
    cut = 1 + branch % len(turns)
    prompts.append([*messages[:cut], ChatMessage("user", "edited " + system)])
    for n, conversation in enumerate(prompts):
        rendered = renderer.render(conversation, specs, cache, f"call{n}")
        expected = tokenizer.apply_chat_template(
            [m.to_template_dict() for m in conversation],
            tools=[t.to_template_dict() for t in specs] or None,
            add_generation_prompt=True,
            tokenize=False,
        )
        assert rendered.text == expected
        assert rendered.token_ids == tokenizer.encode(expected, add_special_tokens=False)


def test_prefix_cache_reuses_tokens_and_finds_the_parent(tokenizer) -> None:
    renderer = ChatRenderer(tokenizer)
    cache = PrefixCache(4)
    first = [ChatMessage("system", "sys"), ChatMessage("user", "hello " * 50)]
    a = renderer.render(first, _TOOLS, cache, "call-a")
    second = [*first, ChatMessage("assistant", "hi"), ChatMessage("user", "more")]
    b = renderer.render(second, _TOOLS, cache, "call-b")
    assert a.reused_tokens == 0
    assert b.reused_tokens > len(a.token_ids) - 5
    assert b.parent_call_id == "call-a"
    assert b.token_ids[: b.reused_tokens] == a.token_ids[: b.reused_tokens]


def test_verify_mode_checks_every_prompt(tokenizer) -> None:
    renderer = ChatRenderer(tokenizer, verify=True)
    cache = PrefixCache(2)
    msgs = [ChatMessage("user", "x")]
    for extra in ("a", "b", "c"):
        msgs = [*msgs, ChatMessage("assistant", extra), ChatMessage("user", extra * 3)]
        renderer.render(msgs, [], cache, extra)


def test_template_without_tools_gets_the_hermes_fallback() -> None:
    tok = build_tiny_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    renderer = ChatRenderer(tok)
    assert not renderer.supports_tools
    msgs = [
        ChatMessage("user", "read a.py"),
        ChatMessage("assistant", "", tool_calls=[ToolCall("c1", "read_file", {"path": "a.py"})]),
        ChatMessage("tool", "print(1)", tool_call_id="c1", name="read_file"),
    ]
    text = renderer.render_text(msgs, _TOOLS)
    assert text.startswith("<|im_start|>system\n# Tools")
    assert '"name": "read_file"' in text.split("\n</tools>")[0]
    assert '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response>\nprint(1)\n</tool_response><|im_end|>" in text
