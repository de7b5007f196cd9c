"""A session's translation memo: an agent loop's next turn translates only its new messages, and gets what a
translation from scratch gives, whatever changed in the history it resends."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from model_proxy.core.normalize import build_rules
from model_proxy.core.render import ChatRenderer, PrefixCache
from model_proxy.core.sessions import SessionRegistry
from model_proxy.core.store import SessionStore
from model_proxy.core.translation_memo import TranslationMemo
from model_proxy.errors import MalformedRequest
from model_proxy.models import InternalRequest
from model_proxy.protocols import AnthropicAdapter, OpenAIChatAdapter

Body = dict[str, Any]


def _turn(i: int, arg: Any = None) -> list[Body]:
    """An assistant tool call and the user's tool result (and a text block)."""
    return [
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": f"plan {i}", "signature": "s"},
                {"type": "text", "text": f"step {i}"},
                {"type": "tool_use", "id": f"tu{i}", "name": "Read", "input": {"path": f"{i}.py", "n": arg}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": f"tu{i}", "content": [{"type": "text", "text": f"body {i}"}]},
                {"type": "image", "source": {}},
                {"type": "text", "text": "go on"},
            ],
        },
    ]


def _body(messages: list[Body]) -> Body:
    return {
        "model": "m",
        "max_tokens": 50,
        "system": [{"type": "text", "text": "You are an agent."}],
        "tools": [
            {"name": "Read", "description": "read", "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search"},
        ],
        "messages": messages,
    }


def _fresh(body: Body) -> Body:
    """The body as a new decode gives it (no object shared with an earlier request)."""
    decoded: Body = json.loads(json.dumps(body))
    return decoded


def _same(a: InternalRequest, b: InternalRequest) -> None:
    # repr tells 1, 1.0 and True apart (== does not), and shows every field of every message.
    assert repr(a.messages) == repr(b.messages)
    assert a.normalized == b.normalized
    assert repr(a.tools) == repr(b.tools)


def test_a_growing_conversation_translates_as_from_scratch_reusing_the_unchanged_messages() -> None:
    adapter = AnthropicAdapter()
    memo = TranslationMemo()
    history: list[Body] = [{"role": "user", "content": "fix it"}]
    previous: InternalRequest | None = None
    for i in range(5):
        history = [*history, *_turn(i, i)]
        body = _body(history)
        with_memo = adapter.parse(_fresh(body), memo=memo).internal
        _same(with_memo, adapter.parse(_fresh(body)).internal)
        # The tool result of a reused tool_use still gets its tool's name.
        assert [m.name for m in with_memo.messages if m.role == "tool"] == ["Read"] * (i + 1)
        assert with_memo.normalized["ignored"].count("user block image") == i + 1
        if previous is not None:
            # Every message but the system prompt (translated each time) is the previous call's very object.
            kept = len(previous.messages) - 1
            assert all(a is b for a, b in zip(with_memo.messages[1 : 1 + kept], previous.messages[1:], strict=True))
            assert not {id(m) for m in with_memo.messages[1 + kept :]} & {id(m) for m in previous.messages}
        previous = with_memo


@pytest.mark.parametrize("resent", [1.0, True, "1", {"n": 1}])
def test_a_value_resent_with_another_type_is_translated_again(resent: Any) -> None:
    adapter = AnthropicAdapter()
    memo = TranslationMemo()
    history = [{"role": "user", "content": "go"}, *_turn(0, 1), *_turn(1, 2)]
    first = adapter.parse(_fresh(_body(history)), memo=memo).internal
    changed = copy.deepcopy(history)
    changed[1]["content"][2]["input"]["n"] = resent  # == 1 for 1.0 and True, yet tojson prints it otherwise
    body = _body([*changed, *_turn(2, 3)])
    second = adapter.parse(_fresh(body), memo=memo).internal
    _same(second, adapter.parse(_fresh(body)).internal)
    assert repr(second.messages[2].tool_calls[0].arguments["n"]) == repr(resent)
    assert second.messages[1] is first.messages[1]  # the message before the change is still reused
    assert second.messages[2] is not first.messages[2]


def test_keys_in_another_order_or_an_edited_history_are_translated_again() -> None:
    adapter = AnthropicAdapter()
    memo = TranslationMemo()
    history = [{"role": "user", "content": "go"}, *_turn(0), *_turn(1), *_turn(2)]
    adapter.parse(_fresh(_body(history)), memo=memo)
    reordered = copy.deepcopy(history)
    reordered[3] = {"content": reordered[3]["content"], "role": "assistant"}
    edited = [*copy.deepcopy(history[:2]), {"role": "user", "content": "compacted"}, *_turn(3)]
    for messages in (reordered, edited, history[:3], []):
        body = _body(messages)
        _same(adapter.parse(_fresh(body), memo=memo).internal, adapter.parse(_fresh(body)).internal)


def test_an_invalid_new_message_is_reported_at_its_index_and_the_memo_still_works() -> None:
    adapter = AnthropicAdapter()
    memo = TranslationMemo()
    history = [{"role": "user", "content": "go"}, *_turn(0), *_turn(1)]
    adapter.parse(_fresh(_body(history)), memo=memo)
    for bad in (
        {"role": "robot", "content": "x"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "input": {}}]},
    ):
        body = _body([*history, bad])
        with pytest.raises(MalformedRequest) as with_memo:
            adapter.parse(_fresh(body), memo=memo)
        with pytest.raises(MalformedRequest) as without:
            adapter.parse(_fresh(body))
        assert str(with_memo.value) == str(without.value)
    assert "messages.5" in str(with_memo.value) or "tool_use blocks need" in str(with_memo.value)
    body = _body([*history, *_turn(2)])
    _same(adapter.parse(_fresh(body), memo=memo).internal, adapter.parse(_fresh(body)).internal)


def test_normalisation_never_changes_a_shared_message() -> None:
    """Claude Code's per-request billing line in a system turn is stripped on every call that resends it."""
    adapter = AnthropicAdapter()
    memo = TranslationMemo()
    rules = build_rules(["strip_anthropic_billing_header"], {})
    history = [
        {"role": "system", "content": "x-anthropic-billing-header: cch=1;\nBe careful."},
        {"role": "user", "content": "go"},
        *_turn(0),
    ]
    fired = []
    texts = []
    for i in range(3):
        req = adapter.parse(_fresh(_body([*history, *_turn(i + 1)])), memo=memo).internal
        shared = req.messages[1]
        fired.append([rule.name for rule in rules if rule.apply(req)])
        texts.append(req.messages[1].content)
        assert shared.content.startswith("x-anthropic-billing-header")  # the memo's object is untouched
    assert fired == [["strip_anthropic_billing_header"]] * 3
    assert texts == ["Be careful."] * 3


def test_reused_messages_render_as_a_full_render_and_reuse_their_dicts(tokenizer: Any) -> None:
    adapter = AnthropicAdapter()
    memo = TranslationMemo()
    renderer = ChatRenderer(tokenizer, verify=True)  # raises if a render differs from apply_chat_template
    cache = PrefixCache(4)
    history: list[Body] = [{"role": "user", "content": "fix it"}]
    dicts: list[dict[str, Any]] | None = None
    for i in range(4):
        history = [*history, *_turn(i, i)]
        req = adapter.parse(_fresh(_body(history)), memo=memo).internal
        rendered = renderer.render(req.messages, req.tools, cache, f"c{i}")
        assert rendered.message_dicts == [m.to_template_dict() for m in req.messages]
        if dicts is not None:
            assert rendered.message_dicts is not None
            assert all(a is b for a, b in zip(rendered.message_dicts[1 : len(dicts)], dicts[1:], strict=True))
        dicts = rendered.message_dicts


def _chat_turn(i: int, arg: Any = None) -> list[Body]:
    """A Chat Completions assistant tool call and its tool result."""
    arguments = json.dumps({"path": f"{i}.py", "n": arg})
    return [
        {
            "role": "assistant",
            "content": f"step {i}",
            "reasoning_content": f"plan {i}",
            "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": "read", "arguments": arguments}}],
        },
        {"role": "tool", "tool_call_id": f"c{i}", "content": [{"type": "text", "text": f"body {i}"}]},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "go"}]},
    ]


def _chat_body(messages: list[Body]) -> Body:
    return {
        "model": "m",
        "messages": [{"role": "system", "content": "You are an agent."}, *messages],
        "tools": [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}],
    }


def test_a_growing_chat_completions_conversation_translates_as_from_scratch() -> None:
    adapter = OpenAIChatAdapter()
    memo = TranslationMemo()
    history: list[Body] = [{"role": "user", "content": "fix it"}]
    previous: InternalRequest | None = None
    for i in range(4):
        history = [*history, *_chat_turn(i, i)]
        body = _chat_body(history)
        with_memo = adapter.parse(_fresh(body), memo=memo).internal
        _same(with_memo, adapter.parse(_fresh(body)).internal)
        assert [m.name for m in with_memo.messages if m.role == "tool"] == ["read"] * (i + 1)
        assert with_memo.normalized["ignored"].count("user part image_url") == i + 1
        if previous is not None:
            kept = len(previous.messages)
            assert all(a is b for a, b in zip(with_memo.messages[:kept], previous.messages, strict=True))
        previous = with_memo
    # Arguments resent as 1.0 instead of 1 (the same JSON number to ==) are parsed again.
    changed = copy.deepcopy(history)
    changed[1]["tool_calls"][0]["function"]["arguments"] = json.dumps({"path": "0.py", "n": 0.0})
    body = _chat_body(changed)
    again = adapter.parse(_fresh(body), memo=memo).internal
    _same(again, adapter.parse(_fresh(body)).internal)
    assert repr(again.messages[2].tool_calls[0].arguments["n"]) == "0.0"
    # A bad new message is reported where it is in the whole request.
    bad = _chat_body([*history, {"role": "robot", "content": "x"}])
    with pytest.raises(MalformedRequest) as with_memo_error:
        adapter.parse(_fresh(bad), memo=memo)
    with pytest.raises(MalformedRequest) as without:
        adapter.parse(_fresh(bad))
    assert str(with_memo_error.value) == str(without.value)
    assert f"messages.{len(history) + 1}" in str(without.value)


@pytest.mark.parametrize("protocol", ["anthropic", "chat"])
def test_a_request_resent_as_it_was_validates_and_translates_the_same(protocol: str) -> None:
    """A retry resends the very same messages; Chat Completions requires at least one message to validate."""
    adapter: AnthropicAdapter | OpenAIChatAdapter = (
        AnthropicAdapter() if protocol == "anthropic" else OpenAIChatAdapter()
    )
    body = _body([{"role": "user", "content": "go"}, *_turn(0)]) if protocol == "anthropic" else _chat_body([])
    memo = TranslationMemo()
    first = adapter.parse(_fresh(body), memo=memo).internal
    for _ in range(2):
        again = adapter.parse(_fresh(body), memo=memo).internal
        _same(again, first)


async def test_a_closed_session_drops_its_memo(tmp_path: Path) -> None:
    registry = SessionRegistry(SessionStore(tmp_path, fsync=False), prefix_cache_entries=2)
    session, _ = await registry.open("s", "policy")
    memo = session.translation_memo(AnthropicAdapter.protocol)
    assert memo is not None
    assert session.translation_memo(AnthropicAdapter.protocol) is memo  # one per protocol, kept between calls
    messages = [{"role": "user", "content": "go"}, *_turn(0)]
    AnthropicAdapter().parse(_fresh(_body(messages)), memo=memo)
    known = TranslationMemo().keys([*messages, {"role": "user", "content": "more"}])  # marshalled afresh
    assert known is not None
    keys = known.keys
    assert memo.reuse(keys).count == len(messages)
    await registry.close("s")
    assert session.translation_memos == {}
    assert session.translation_memo(AnthropicAdapter.protocol) is None
