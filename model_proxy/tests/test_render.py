from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
import transformers.utils.chat_template_utils as hf_templates
from hypothesis import given, settings
from hypothesis import strategies as st

import model_proxy.core.store as store_module
import model_proxy.core.template as template_module
from model_proxy.core.render import ChatRenderer, PrefixCache
from model_proxy.core.store import LineMemo, SessionStore
from model_proxy.models import ChatMessage, ToolCall, ToolSpec
from polar_core.errors import InvalidArgument
from polar_core.model_fixtures import build_tiny_tokenizer
from polar_core.record_delta import expand_rows, is_delta
from polar_core.records import CompletionRecord

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
        assert rendered.token_ids_json == ",".join(map(str, rendered.token_ids))


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


def _reference_ids(tokenizer: Any, conversation: list[ChatMessage], specs: list[ToolSpec], **kw: Any) -> list[int]:
    text = tokenizer.apply_chat_template(
        [m.to_template_dict() for m in conversation],
        tools=[t.to_template_dict() for t in specs] or None,
        add_generation_prompt=True,
        tokenize=False,
        **kw,
    )
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    return ids


@st.composite
def _agent_step(draw: st.DrawFn) -> list[ChatMessage]:
    """What one agent-loop turn appends: the assistant's answer, then tool results or a user message."""
    n_calls = draw(st.integers(0, 2))
    calls = [ToolCall(f"c{i}", "read_file", {"path": draw(_TEXT)}) for i in range(n_calls)]
    reasoning = draw(st.one_of(st.none(), _TEXT))
    step = [ChatMessage("assistant", draw(_TEXT), tool_calls=calls, reasoning=reasoning)]
    if calls:
        step += [ChatMessage("tool", draw(_TEXT), tool_call_id=c.id, name=c.name) for c in calls]
    else:
        step.append(ChatMessage("user", draw(_TEXT)))
    return step


@settings(max_examples=60, deadline=None)
@given(system=_TEXT, first=_TEXT, steps=st.lists(_agent_step(), min_size=1, max_size=7), tools=st.booleans())
def test_incremental_rendering_of_agent_loops_equals_a_full_render(
    tokenizer, system: str, first: str, steps: list[list[ChatMessage]], tools: bool
) -> None:
    renderer = ChatRenderer(tokenizer)
    assert renderer.incremental_rendering
    cache = PrefixCache(4)
    specs = _TOOLS if tools else []
    conversation = [ChatMessage("system", system), ChatMessage("user", first)]
    renderer.render(conversation, specs, cache, "call0")
    for n, step in enumerate(steps, 1):
        conversation = [*conversation, *step]
        rendered = renderer.render(conversation, specs, cache, f"call{n}")
        # Identical IDs, including BPE effects where the appended text meets the cached prefix.
        assert rendered.token_ids == _reference_ids(tokenizer, conversation, specs)
        assert rendered.token_ids_json == ",".join(map(str, rendered.token_ids))
        assert rendered.parent_call_id == f"call{n - 1}"


def test_agent_loop_renders_only_a_window(tokenizer) -> None:
    renderer = ChatRenderer(tokenizer, verify=True)
    cache = PrefixCache(4)
    conversation = [ChatMessage("system", "sys"), ChatMessage("user", "go")]
    used = []
    for i in range(6):
        rendered = renderer.render(conversation, _TOOLS, cache, f"c{i}")
        used.append(rendered.rendered_incrementally)
        call = ToolCall(f"t{i}", "read_file", {"path": f"{i}.py"})
        conversation = [
            *conversation,
            ChatMessage("assistant", f"step {i}", [call]),
            ChatMessage("tool", f"body {i}", tool_call_id=call.id),
        ]
    assert used[0] is False
    assert all(used[2:])


_NO_TOOLS_TEMPLATE = (
    "{% for m in messages %}{% if loop.first and m.role != 'system' %}<|im_start|>system\nDefault.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@settings(max_examples=30, deadline=None)
@given(steps=st.lists(_agent_step(), min_size=1, max_size=6), system=st.booleans())
def test_incremental_rendering_with_the_hermes_fallback(steps: list[list[ChatMessage]], system: bool) -> None:
    tok = build_tiny_tokenizer()
    tok.chat_template = _NO_TOOLS_TEMPLATE
    renderer = ChatRenderer(tok)
    assert not renderer.supports_tools
    assert renderer.incremental_rendering
    cache = PrefixCache(4)
    conversation = [*([ChatMessage("system", "sys")] if system else []), ChatMessage("user", "go")]
    for n, step in enumerate([[], *steps]):
        conversation = [*conversation, *step]
        rendered = renderer.render(conversation, _TOOLS, cache, f"c{n}")
        assert rendered.text == renderer.reference_text(conversation, _TOOLS)
        assert rendered.token_ids == tok.encode(rendered.text, add_special_tokens=False)


# Like Qwen3: reasoning is shown only on assistant turns after the last user message, so appending a user
# turn changes how older turns render.
_DROPS_OLD_REASONING = (
    "{% set ns = namespace(last=-1) %}{% for m in messages %}{% if m.role == 'user' %}"
    "{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and m.reasoning_content and loop.index0 > ns.last %}"
    "<think>{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}{{ tools | length if tools else '' }}"
)


def test_a_template_that_rewrites_old_turns_is_rendered_in_full() -> None:
    tok = build_tiny_tokenizer()
    tok.chat_template = _DROPS_OLD_REASONING
    renderer = ChatRenderer(tok)
    assert renderer.compiled_rendering
    assert not renderer.incremental_rendering
    cache = PrefixCache(4)
    conversation = [ChatMessage("user", "q")]
    for i in range(4):
        conversation = [
            *conversation,
            ChatMessage("assistant", f"a{i}", reasoning=f"r{i}"),
            ChatMessage("user", f"q{i}"),
        ]
        rendered = renderer.render(conversation, [], cache, f"c{i}")
        assert not rendered.rendered_incrementally
        assert rendered.token_ids == _reference_ids(tok, conversation, [])


class _Clock:
    now_value = dt.datetime(2026, 1, 1, 23, 59)

    @classmethod
    def now(cls) -> dt.datetime:
        return cls.now_value


def test_a_dated_template_is_rerendered_when_the_date_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(template_module, "datetime", _Clock)
    monkeypatch.setattr(hf_templates, "datetime", _Clock)  # apply_chat_template's clock, for the probes
    tok = build_tiny_tokenizer()
    tok.chat_template = (
        "<|im_start|>system\nToday is {{ strftime_now('%d %b %Y') }}.<|im_end|>\n"
        + _NO_TOOLS_TEMPLATE.replace("{% if loop.first and m.role != 'system' %}", "{% if false %}")
    )
    renderer = ChatRenderer(tok)
    assert renderer.incremental_rendering
    cache = PrefixCache(4)
    conversation = [ChatMessage("user", "hi")]
    for day in (1, 1, 2):
        _Clock.now_value = dt.datetime(2026, 1, day, 23, 59)
        conversation = [*conversation, ChatMessage("assistant", "ok"), ChatMessage("user", "more")]
        rendered = renderer.render(conversation, [], cache, f"d{day}")
        assert f"Today is {day:02d} Jan 2026." in rendered.text
        assert rendered.text.count("Today is") == 1


def test_store_line_with_precomputed_prompt_ids_is_the_same_record(tmp_path) -> None:
    ids = [5, 17, 1024, 3]
    record = CompletionRecord("s", "c", 0, ids, [1, 2], [-0.5, -0.25], protocol="openai_chat", extra={"k": "v"})
    store = SessionStore(tmp_path, fsync=False)
    (tmp_path / "sessions" / "s").mkdir(parents=True)
    store.append(record, prompt_ids_json="5,17,1024,3")
    store.append(record)
    a, b = (tmp_path / "sessions" / "s" / "completions.jsonl").read_text().splitlines()
    assert json.loads(a) == json.loads(b) == record.to_dict()
    assert a == b == json.dumps(record.to_dict(), separators=(",", ":"), ensure_ascii=False)


def _turn_record(seq: int, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> CompletionRecord:
    request: dict[str, Any] = {"model": "m", "messages": messages}
    if tools is not None:
        request["tools"] = tools
    request["tool_choice"] = None
    return CompletionRecord("s", f"c{seq}", seq, [1, 2, 3 + seq], [4], [-0.5], request=request, extra={"k": seq})


def test_store_lines_reusing_the_last_messages_text_are_the_lines_written_without_it(tmp_path, monkeypatch) -> None:
    """Every line written with a session's LineMemo is, once a delta line is expanded, byte for byte the line
    written without one, whatever changes between calls: growth, an edited earlier message, a tool call's
    argument resent as 1.0 or true where it was 1 (equal under ==), a tool call or a tool schema whose keys
    come in another order, a schema's 1 resent as 1.0 or true, changed or dropped tools, a message list that is
    not a prefix, no messages at all; the memo serialises only what it has not seen, and a line that continues
    the last one is a delta line holding only what is new."""
    function: dict[str, Any] = {"name": "run", "parameters": {"type": "object"}}
    tool: dict[str, Any] = {"type": "function", "function": function}

    def call(n: Any) -> dict[str, Any]:
        args = {"path": "a.py", "n": n}
        return {"role": "assistant", "content": "", "tool_calls": [{"id": "t", "function": {"arguments": args}}]}

    history: list[dict[str, Any]] = [{"role": "user", "content": "fix it"}, call(1)]
    turns: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = []
    for i in range(3):
        history = [*history, {"role": "assistant", "content": f"step {i}"}, {"role": "user", "content": "ok é"}]
        turns.append((history, [tool]))
    edited = [dict(m) for m in history]
    edited[2]["content"] = "step 0, edited"
    turns += [
        (edited, [tool]),  # an earlier message changed: the lines after it are serialised again
        ([edited[0], call(1.0), *edited[2:]], [tool]),  # == the last one, but not the same JSON
        ([edited[0], call(True), *edited[2:]], [tool]),
        ([edited[0], {**dict(reversed(call(1).items()))}, *edited[2:]], [tool]),  # same items, another order
        (edited, [{"function": function, "type": "function"}]),  # the tool's keys in another order
        (edited, [{**tool, "function": {**function, "parameters": {"type": "object", "minItems": 1}}}]),
        (edited, [{**tool, "function": {**function, "parameters": {"type": "object", "minItems": 1.0}}}]),
        (edited, [{**tool, "function": {**function, "parameters": {"type": "object", "minItems": True}}}]),
        (edited, [tool, {**tool, "function": {"name": "other"}}]),  # tools changed
        (edited, None),  # tools dropped
        ([{"role": "user", "content": "a new conversation"}], [tool]),  # not a prefix of the last one
        ([], [tool]),
        (history, [tool]),
    ]
    with_memo, without = SessionStore(tmp_path / "a", fsync=False), SessionStore(tmp_path / "b", fsync=False)
    for root in ("a", "b"):
        (tmp_path / root / "sessions" / "s").mkdir(parents=True)
    memo = LineMemo()
    dumped: list[Any] = []
    real = store_module._dumps

    def counting(obj: Any) -> str:
        dumped.append(obj)
        return real(obj)

    monkeypatch.setattr(store_module, "_dumps", counting)
    for seq, (messages, tools) in enumerate(turns):
        record = _turn_record(seq, messages, tools)
        dumped.clear()
        with_memo.append(record, prompt_ids_json=f"1,2,{3 + seq}", memo=memo)
        if seq in (1, 2):  # growth: only the two new messages are serialised, not the tool call nor the tools
            assert [m for m in dumped if isinstance(m, dict) and "role" in m] == messages[-2:]
            assert tools not in dumped
        without.append(record)
    a = (tmp_path / "a" / "sessions" / "s" / "completions.jsonl").read_bytes().splitlines()
    b = (tmp_path / "b" / "sessions" / "s" / "completions.jsonl").read_bytes().splitlines()
    assert len(a) == len(turns)
    rows = [json.loads(line) for line in a]

    def full_line(record: CompletionRecord) -> bytes:
        return json.dumps(record.to_dict(), separators=(",", ":"), ensure_ascii=False).encode()

    assert [full_line(r) for r in expand_rows(rows)] == b
    records = [_turn_record(seq, m, t) for seq, (m, t) in enumerate(turns)]
    assert b == [full_line(r) for r in records]
    assert list(expand_rows(rows)) == records
    assert not is_delta(rows[0])
    assert all(is_delta(row) for row in rows[1:3])
    assert rows[2]["request"]["messages"] == turns[2][0][-2:]
    assert rows[2]["request"]["tools"] == 0
    assert all(len(a[i]) < len(b[i]) for i in (1, 2))
    with pytest.raises(InvalidArgument, match="prompt_token_ids"):
        CompletionRecord.from_dict(rows[1])  # a reader that knows no delta lines fails, never reads a tail


def test_tool_schemas_serialised_once_per_session_and_changed_tools_rendered_anew(tokenizer, monkeypatch) -> None:
    """An agent loop's window renders reuse the cached tool dicts (tojson serialises each schema once), and a
    tool whose schema changes between turns is rendered with its new text; every prompt equals a full render."""
    renderer = ChatRenderer(tokenizer)
    assert renderer.incremental_rendering
    dumped: list[str] = []
    real = template_module._tojson

    def counting(x: Any, *args: Any) -> str:
        text = real(x, *args)
        if isinstance(x, dict) and x.get("function", x).get("name", "").startswith("tool_"):
            dumped.append(text)
        return text

    monkeypatch.setattr(template_module, "_tojson", counting)

    def tools(version: int) -> list[ToolSpec]:
        schema = {"type": "object", "properties": {"path": {"type": "string"}}}
        return [ToolSpec(f"tool_{i}", f"Tool {i}, version {version}.", schema) for i in range(5)]

    cache = PrefixCache(4)
    messages = [ChatMessage("system", "Be brief."), ChatMessage("user", "start")]
    per_turn: list[int] = []
    for turn in range(8):
        specs = tools(1 if turn < 5 else 2)
        before = len(dumped)
        rendered = renderer.render(messages, specs, cache, f"call{turn}")
        expected = renderer.reference_text(messages, specs)
        assert rendered.text == expected
        assert rendered.token_ids == tokenizer.encode(expected, add_special_tokens=False)
        assert ("version 2" in rendered.text) == (turn >= 5)
        if turn >= 2:
            assert rendered.rendered_incrementally == (turn != 5)  # new tools: rendered in full
        per_turn.append(len(dumped) - before)
        messages = [*messages, ChatMessage("assistant", f"a{turn}"), ChatMessage("user", f"u{turn}")]
    # Full renders (turns 0-1: the window is the whole conversation; turn 5: new tools) serialise the 5 schemas
    # once for all their renders; incremental turns reuse the cached dicts and serialise none.
    assert per_turn == [5, 5, 0, 0, 0, 5, 0, 0]
