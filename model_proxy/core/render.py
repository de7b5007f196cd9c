"""Rendering an internal request with the policy model's chat template, and tokenising it incrementally.

Rendering uses the tokenizer's own template (``apply_chat_template(messages, tools=..., add_generation_prompt=
True)``). A template that does not mention ``tools`` gets the documented Hermes fallback: tool signatures are
appended to the system prompt, assistant tool calls become ``<tool_call>`` JSON text and tool results become
user turns with ``<tool_response>`` blocks; the model's template then renders plain messages.

Tokenisation is incremental per session. Hugging Face tokenizers split text at added tokens (``<|im_end|>``,
...) *before* normalising, pre-tokenising and applying the model, so the text after an added token is
tokenised independently of the text before it. A :class:`PrefixCache` remembers recent prompts with the
positions right after each such token; a new prompt that shares a prefix with a cached one reuses the cached
IDs up to the last boundary inside the shared prefix and tokenises only the rest. Boundaries are only taken
at added tokens that strip no neighbouring whitespace, and the renderer checks the rule on a probe
conversation at start-up (disabling the cache if it fails); the unit tests prove equality to a full
tokenisation on generated conversations.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
from collections import OrderedDict
from typing import Any, Protocol

from model_proxy.core.types import ChatMessage, ToolSpec
from polar_core.errors import Internal

__all__ = ["ChatRenderer", "PrefixCache", "RenderedPrompt", "fallback_messages"]


class ChatTokenizer(Protocol):
    """The part of a Hugging Face tokenizer the renderer uses."""

    chat_template: Any

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        """Render a conversation."""
        ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]:
        """Tokenise text."""
        ...


@dataclasses.dataclass(slots=True)
class _Entry:
    text: str
    ids: list[int]
    boundary_chars: list[int]
    """Character offsets right after a boundary token, ascending."""
    boundary_tokens: list[int]
    """Number of IDs up to and including that boundary token."""
    call_id: str


@dataclasses.dataclass(frozen=True, slots=True)
class RenderedPrompt:
    """A rendered and tokenised prompt.

    Attributes:
        text: The rendered prompt text.
        token_ids: Its token IDs.
        reused_tokens: IDs taken from the prefix cache instead of tokenised again.
        parent_call_id: The call whose prompt this one extends, when the cache knows it.
    """

    text: str
    token_ids: list[int]
    reused_tokens: int
    parent_call_id: str | None


class PrefixCache:
    """Recently rendered prompts of one session (least recently used dropped first)."""

    def __init__(self, max_entries: int) -> None:
        self._max = max_entries
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def best(self, text: str) -> tuple[_Entry | None, int]:
        """Return the entry sharing the longest prefix with ``text`` and that prefix's length."""
        best: _Entry | None = None
        best_len = 0
        for entry in reversed(self._entries.values()):
            n = _common_prefix_len(text, entry.text)
            if n > best_len:
                best, best_len = entry, n
        return best, best_len

    def add(self, entry: _Entry) -> None:
        if self._max <= 0:
            return
        self._entries.pop(entry.text, None)
        self._entries[entry.text] = entry
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def parent_of(self, text: str) -> str | None:
        """The most recent call whose whole prompt is a prefix of ``text``."""
        for entry in reversed(self._entries.values()):
            if entry.call_id and text.startswith(entry.text):
                return entry.call_id
        return None


def _common_prefix_len(a: str, b: str) -> int:
    if a.startswith(b):
        return len(b)
    lo, hi = 0, min(len(a), len(b))
    # Binary search on prefix equality: each comparison is a C-level memcmp.
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def fallback_messages(messages: list[ChatMessage], tools: list[ToolSpec]) -> list[dict[str, Any]]:
    """Render tools Hermes-style into plain messages for a template without tool support.

    Tool signatures go at the end of the system prompt (one is added when missing), assistant tool calls are
    appended to the assistant text as ``<tool_call>`` blocks, and consecutive tool results become one user
    turn of ``<tool_response>`` blocks.
    """
    out: list[dict[str, Any]] = []
    if tools:
        section = (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
            + "".join("\n" + json.dumps(t.to_template_dict(), ensure_ascii=False) for t in tools)
            + "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
            'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
            '"arguments": <args-json-object>}\n</tool_call>'
        )
        if messages and messages[0].role == "system":
            first = messages[0].content
            out.append({"role": "system", "content": f"{first}\n\n{section}" if first else section})
            messages = messages[1:]
        else:
            out.append({"role": "system", "content": section})
    for msg in messages:
        if msg.role == "tool":
            block = f"<tool_response>\n{msg.content}\n</tool_response>"
            if out and out[-1].get("_tool"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool": True})
            continue
        content = msg.content
        for call in msg.tool_calls:
            payload = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
            content += ("\n" if content else "") + f"<tool_call>\n{payload}\n</tool_call>"
        item: dict[str, Any] = {"role": msg.role, "content": content}
        if msg.reasoning:
            item["reasoning_content"] = msg.reasoning
        out.append(item)
    for item in out:
        item.pop("_tool", None)
    return out


class ChatRenderer:
    """Renders internal requests with the model's chat template and tokenises them (prefix-cached)."""

    def __init__(self, tokenizer: Any, *, chat_template: str = "", verify: bool = False) -> None:
        """Create a renderer.

        Args:
            tokenizer: A Hugging Face tokenizer (a fast one enables incremental tokenisation).
            chat_template: A template overriding the tokenizer's own; empty keeps it.
            verify: Tokenise every prompt in full too and raise :class:`Internal` on a mismatch.
        """
        self._tok = tokenizer
        self._template: str | None = chat_template or None
        template_text = chat_template or _template_text(tokenizer)
        self.supports_tools = "tools" in template_text
        self._verify = verify
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._fast = backend
        self._boundary_ids: frozenset[int] = frozenset()
        if backend is not None:
            decoder = tokenizer.added_tokens_decoder
            self._boundary_ids = frozenset(
                i for i, tok in decoder.items() if not tok.lstrip and not tok.rstrip and not tok.normalized
            )
        self.incremental = bool(self._boundary_ids)
        self.incremental = self.incremental and self._probe()

    def render_text(self, messages: list[ChatMessage], tools: list[ToolSpec]) -> str:
        """Render the prompt text, ending with the assistant generation prompt."""
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": True}
        if self._template is not None:
            kwargs["chat_template"] = self._template
        if tools and not self.supports_tools:
            conversation = fallback_messages(messages, tools)
        else:
            conversation = [m.to_template_dict() for m in messages]
            if tools:
                kwargs["tools"] = [t.to_template_dict() for t in tools]
        text = self._tok.apply_chat_template(conversation, **kwargs)
        if not isinstance(text, str):
            raise Internal("chat template did not render to text")
        return text

    def render(
        self, messages: list[ChatMessage], tools: list[ToolSpec], cache: PrefixCache | None, call_id: str
    ) -> RenderedPrompt:
        """Render and tokenise a prompt, reusing a cached prefix when safe, and remember it in ``cache``."""
        text = self.render_text(messages, tools)
        return self.tokenize(text, cache, call_id)

    def tokenize(self, text: str, cache: PrefixCache | None, call_id: str = "") -> RenderedPrompt:
        """Tokenise rendered text, reusing a cached prefix when safe."""
        if not self.incremental or cache is None:
            return RenderedPrompt(text, self._full(text), 0, None)
        parent = cache.parent_of(text)
        entry, shared = cache.best(text)
        start_char, start_tok = 0, 0
        if entry is not None:
            k = bisect.bisect_right(entry.boundary_chars, shared) - 1
            if k >= 0:
                start_char, start_tok = entry.boundary_chars[k], entry.boundary_tokens[k]
        tail_ids, tail_chars, tail_toks = self._encode_with_boundaries(text[start_char:])
        if entry is not None and start_tok:
            k = bisect.bisect_right(entry.boundary_chars, start_char)
            ids = entry.ids[:start_tok] + tail_ids
            chars = entry.boundary_chars[:k] + [c + start_char for c in tail_chars]
            toks = entry.boundary_tokens[:k] + [t + start_tok for t in tail_toks]
        else:
            ids, chars, toks = tail_ids, tail_chars, tail_toks
        if self._verify and ids != self._full(text):
            raise Internal("incremental tokenisation differs from a full tokenisation")
        cache.add(_Entry(text, ids, chars, toks, call_id))
        return RenderedPrompt(text, ids, start_tok, parent)

    def _full(self, text: str) -> list[int]:
        if self._fast is not None:
            return list(self._fast.encode(text, add_special_tokens=False).ids)
        return list(self._tok.encode(text, add_special_tokens=False))

    def _encode_with_boundaries(self, text: str) -> tuple[list[int], list[int], list[int]]:
        if self._fast is None:
            return self._full(text), [], []
        enc = self._fast.encode(text, add_special_tokens=False)
        ids: list[int] = enc.ids
        boundary = self._boundary_ids
        chars: list[int] = []
        toks: list[int] = []
        offsets = enc.offsets
        for i, tid in enumerate(ids):
            if tid in boundary:
                chars.append(offsets[i][1])
                toks.append(i + 1)
        return ids, chars, toks

    def _probe(self) -> bool:
        """Check the boundary rule on a small conversation; False disables incremental tokenisation."""
        turns = [
            ChatMessage("system", "Be brief.\n"),
            ChatMessage("user", " hello  there\n\n"),
            ChatMessage("assistant", "\n Hi!  ", reasoning="  ok "),
            ChatMessage("user", "\t\tmore  \n"),
        ]
        cache = PrefixCache(4)
        try:
            for n in range(1, len(turns) + 1):
                text = self.render_text(turns[:n], [])
                if self.tokenize(text, cache).token_ids != self._full(text):
                    return False
        except Exception:  # a template that cannot render the probe just disables the optimisation
            return False
        return True


def _template_text(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):
        return template
    if isinstance(template, dict):
        return " ".join(str(v) for v in template.values())
    return ""
