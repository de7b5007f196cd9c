"""Rendering an internal request with the policy model's chat template, and tokenising it, incrementally.

Rendering gives exactly the text of ``tokenizer.apply_chat_template(messages, tools=..., add_generation_prompt=
True, tokenize=False)``. A template that does not mention ``tools`` gets the documented Hermes fallback: tool
signatures are appended to the system prompt, assistant tool calls become ``<tool_call>`` JSON text and tool
results become user turns with ``<tool_response>`` blocks; the model's template then renders plain messages.

**Incremental rendering.** The template is compiled once (:class:`~model_proxy.core.template.CompiledTemplate`)
and each session remembers its recent prompts (:class:`~model_proxy.core.prefix_cache.PrefixCache`). When a
request's messages start with a remembered request's messages and its tools are the same (the agent loop:
one assistant turn and new user/tool turns appended), only a *window* is rendered: the system message plus
the last two old messages (three when needed to keep the parity of user/assistant alternation), once
without and once with the new messages. The new text is the old text without its generation prompt, plus
what the new messages added to the window, plus the generation prompt. The splice is used only when the
window renders are consistent (the longer extends the shorter, the generation prompt is a pure suffix, the
template's clock reads the same); anything else renders the whole conversation. This is exact for templates
whose rendering of a message depends on itself, its neighbours, the system message and the tools (ChatML,
Qwen2.5, Llama 3, SmolLM2, ...); a template whose older turns change when a turn is appended (Qwen3 drops
reasoning before the last user query) is caught by a battery of probe conversations at start-up, which
disables incremental rendering for it. ``verify`` re-renders every prompt with ``apply_chat_template`` and
tokenises it in full.

**Incremental tokenisation.** Hugging Face tokenizers split text at added tokens (``<|im_end|>``, ...)
*before* normalising, pre-tokenising and applying the model, so the text after an added token is tokenised
independently of the text before it. A new prompt reuses a remembered prompt's IDs up to the last such
boundary inside their shared text prefix and tokenises only the rest. Boundaries are only taken at added
tokens that strip no neighbouring whitespace, and a probe conversation checks the rule at start-up.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import json
import logging
import random
from typing import Any

from model_proxy.core.prefix_cache import CacheEntry, MessageDicts, PrefixCache, common_prefix_len, ids_json
from model_proxy.core.template import (
    ClockReading,
    CompiledTemplate,
    clock_still_reads,
    template_message,
    template_messages,
)
from model_proxy.errors import ContextLengthExceeded
from model_proxy.models import ChatMessage, ToolCall, ToolSpec
from polar_core.errors import Internal

__all__ = ["ChatRenderer", "PrefixCache", "RenderedPrompt", "fallback_messages", "max_token_chars"]

_log = logging.getLogger(__name__)
_WINDOW = 2
"""Old messages rendered around the appended ones (besides the system message)."""
_GIL_FREE_CHARS = 16_384
"""Texts at least this long are tokenised with ``encode_batch`` (releases the GIL; a little slower when short)."""
_KEEPS_EVERY_CHAR = frozenset({"ByteLevel", "Metaspace", "Split", "Digits", "Punctuation", "UnicodeScripts"})
_ASCII_STABLE = frozenset({"NFC", "NFD", "NFKC", "NFKD", "Lowercase"})
"""Normalizers that leave ASCII text as it is (so an ASCII text need not be normalised to be measured)."""


def _ascii_stable(tokenizer: Any) -> bool:
    """Whether the tokenizer's normalizer (if any) leaves ASCII text unchanged."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    try:
        normalizer = json.loads(backend.to_str()).get("normalizer") if backend is not None else None
    except (ValueError, AttributeError):
        return False
    if normalizer is None:
        return True
    parts = normalizer.get("normalizers", []) if normalizer.get("type") == "Sequence" else [normalizer]
    return all(part.get("type") in _ASCII_STABLE for part in parts)


def max_token_chars(tokenizer: Any) -> int | None:
    """The most input characters one token can stand for, or None where no such bound holds (see above)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        config = json.loads(backend.to_str())
        model = config["model"]
        kind = model.get("type")
        if kind == "Unigram" and not model.get("byte_fallback"):
            return None  # unknown characters fuse into one <unk>
        if kind == "BPE" and model.get("fuse_unk") and not model.get("byte_fallback"):
            return None
        if kind not in ("BPE", "Unigram"):
            return None  # WordPiece: one [UNK] stands for a whole unknown word
        pre = config.get("pre_tokenizer")
        parts = pre.get("pretokenizers", []) if pre and pre.get("type") == "Sequence" else [pre] if pre else []
        for part in parts:
            if part.get("type") not in _KEEPS_EVERY_CHAR or part.get("behavior") == "Removed":
                return None
        longest = max((len(token) for token in backend.get_vocab(with_added_tokens=True)), default=0)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return longest or None


@dataclasses.dataclass(frozen=True, slots=True)
class RenderedPrompt:
    """A rendered and tokenised prompt.

    Attributes:
        text: The rendered prompt text.
        token_ids: Its token IDs (the prefix cache and the completion record share this list: never changed).
        reused_tokens: IDs taken from the prefix cache instead of tokenised again.
        parent_call_id: The call whose prompt this one extends, when the cache knows it.
        token_ids_json: ``token_ids`` as comma-separated decimals (the inside of their JSON array), when the
            prefix cache built them.
        rendered_incrementally: Whether only a window of the conversation was rendered.
        message_dicts: ``[m.to_template_dict() for m in messages]``, made for the template and not changed since
            (the completion record takes them rather than building them again); None when the template got
            other messages (tools folded into them for a template without tool support).
        tool_dicts: ``[t.to_template_dict() for t in tools]`` as the template got them (not changed since; the
            same objects for a session's calls with the same tools, so the record's line reuses their text).
    """

    text: str
    token_ids: list[int]
    reused_tokens: int
    parent_call_id: str | None
    token_ids_json: str | None = None
    rendered_incrementally: bool = False
    message_dicts: list[dict[str, Any]] | None = None
    tool_dicts: list[dict[str, Any]] | None = None


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


@dataclasses.dataclass(slots=True)
class _Text:
    text: str
    base_len: int
    clock: list[ClockReading]
    incremental: bool


class ChatRenderer:
    """Renders internal requests with the model's chat template and tokenises them (both incrementally)."""

    def __init__(self, tokenizer: Any, *, chat_template: str = "", verify: bool = False) -> None:
        """Create a renderer.

        Args:
            tokenizer: A Hugging Face tokenizer (a fast one enables incremental tokenisation).
            chat_template: A template overriding the tokenizer's own; empty keeps it.
            verify: Render every prompt with ``apply_chat_template`` and tokenise it in full too, and raise
                :class:`Internal` on any difference.
        """
        self._tok = tokenizer
        self._template: str | None = chat_template or None
        self.supports_tools = "tools" in (chat_template or _template_text(tokenizer))
        self._verify = verify
        self._compiled: dict[str, CompiledTemplate] = {}
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._fast = backend
        self._boundary_ids: frozenset[int] = frozenset()
        if backend is not None:
            decoder = tokenizer.added_tokens_decoder
            self._boundary_ids = frozenset(
                i for i, tok in decoder.items() if not tok.lstrip and not tok.rstrip and not tok.normalized
            )
        self.max_token_chars = max_token_chars(tokenizer)
        self._normalizer = getattr(backend, "normalizer", None) if backend is not None else None
        self._ascii_stable = _ascii_stable(tokenizer)
        self.compiled_rendering = self._probe_compiled()
        self.incremental = bool(self._boundary_ids) and self._probe_tokenisation()
        self.incremental_rendering = self.compiled_rendering
        self.incremental_rendering = self.compiled_rendering and self._probe_window()

    # ----- rendering ---------------------------------------------------------------------------------

    def render_text(self, messages: list[ChatMessage], tools: list[ToolSpec]) -> str:
        """Render the whole prompt text, ending with the assistant generation prompt."""
        conversation, tool_dicts = self._inputs(messages, tools)
        template = self._compiled_for(tool_dicts) if self.compiled_rendering else None
        if template is None:
            return self.reference_text(messages, tools)
        return template.render(template_messages(conversation), tool_dicts, True)[0]

    def reference_text(self, messages: list[ChatMessage], tools: list[ToolSpec]) -> str:
        """Render the prompt with ``tokenizer.apply_chat_template`` (the definition of the right text)."""
        conversation, tool_dicts = self._inputs(messages, tools)
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": True}
        if self._template is not None:
            kwargs["chat_template"] = self._template
        if tool_dicts:
            kwargs["tools"] = tool_dicts
        text = self._tok.apply_chat_template(conversation, **kwargs)
        if not isinstance(text, str):
            raise Internal("chat template did not render to text")
        return text

    def check_fits(self, text: str, limit: int) -> None:
        """Refuse ``text`` if it certainly has ``limit`` tokens or more, without tokenising it.

        Costs nothing for a text shorter than ``limit * max_token_chars`` characters; a longer one is normalised
        (if the tokenizer normalises, unless the text is ASCII and the normalizer leaves ASCII alone) and its
        length compared.

        Raises:
            ContextLengthExceeded: ``ceil(characters / max_token_chars) >= limit`` (the prompt's lower bound).
        """
        most = self.max_token_chars
        if most is None or limit <= 0 or len(text) < limit * most:
            return
        chars = len(text)
        if self._normalizer is not None and not (self._ascii_stable and text.isascii()):
            chars = len(self._normalizer.normalize_str(text))
        at_least = -(-chars // most)
        if at_least >= limit:
            raise ContextLengthExceeded(at_least, limit, at_least=True)

    def render(
        self,
        messages: list[ChatMessage],
        tools: list[ToolSpec],
        cache: PrefixCache | None,
        call_id: str,
        *,
        token_limit: int = 0,
    ) -> RenderedPrompt:
        """Render and tokenise a prompt, reusing what ``cache`` remembers when safe, and remember it there.

        ``token_limit`` (when set) refuses, before tokenisation, a prompt that :meth:`check_fits` proves too long.
        """
        conversation, prepared, tool_dicts = self._template_dicts(messages, tools, cache)
        template = self._compiled_for(tool_dicts) if self.compiled_rendering else None
        hint: CacheEntry | None = None
        out: _Text | None = None
        if template is not None and cache is not None and self.incremental_rendering:
            hint = cache.extendable(prepared, tool_dicts)
            if hint is not None and _window_covers_all(prepared):
                hint = None  # a full render costs less than the window renders
            if hint is not None:
                assert hint.messages is not None
                tool_dicts = hint.tools  # equal; the same objects let tojson reuse their text
                out = _extend(template, hint.messages, hint.text, hint.base_len, hint.clock, prepared, tool_dicts)
                if out is None:
                    hint = None
        if out is None:
            if template is None:
                out = _Text(self.reference_text(messages, tools), -1, [], False)
            else:
                out = _render_full(template, prepared, tool_dicts, cache is not None and self.incremental_rendering)
        if self._verify and template is not None and out.text != self.reference_text(messages, tools):
            raise Internal("incremental rendering differs from apply_chat_template")
        if token_limit:
            self.check_fits(out.text, token_limit)
        rendered = self._tokenize(out.text, cache, call_id, hint)
        if cache is not None and rendered.entry is not None:
            entry = rendered.entry
            entry.messages, entry.tools, entry.base_len, entry.clock = prepared, tool_dicts, out.base_len, out.clock
        folded = bool(tools) and not self.supports_tools  # _inputs gave fallback_messages
        return dataclasses.replace(
            rendered.prompt,
            rendered_incrementally=out.incremental,
            message_dicts=None if folded else conversation,
            tool_dicts=None if folded else tool_dicts,
        )

    def _inputs(
        self, messages: list[ChatMessage], tools: list[ToolSpec]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        return _template_inputs(messages, tools, self.supports_tools)

    def _template_dicts(
        self, messages: list[ChatMessage], tools: list[ToolSpec], cache: PrefixCache | None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]] | None]:
        """The conversation's dicts, its template messages and the tool dicts, reusing the dicts ``cache`` made
        for a message object it was given before (at the same position)."""
        if tools and not self.supports_tools:  # folded into the messages: nothing is reused
            conversation, tool_dicts = self._inputs(messages, tools)
            return conversation, template_messages(conversation), tool_dicts
        last = cache.dicts if cache is not None else None
        if last is None:
            last = MessageDicts((), (), ())
        known = len(last.sources)
        conversation = []
        prepared = []
        for i, message in enumerate(messages):
            if i < known and last.sources[i] is message:
                conversation.append(last.conversation[i])
                prepared.append(last.prepared[i])
            else:
                made = message.to_template_dict()
                conversation.append(made)
                prepared.append(template_message(made))
        if cache is not None:
            cache.dicts = MessageDicts(tuple(messages), tuple(conversation), tuple(prepared))
        return conversation, prepared, [t.to_template_dict() for t in tools] or None

    def _compiled_for(self, tools: list[dict[str, Any]] | None) -> CompiledTemplate | None:
        try:
            source = self._tok.get_chat_template(self._template, tools)
        except Exception:  # no template for this case: apply_chat_template raises its own error
            return None
        if not isinstance(source, str):
            return None
        template = self._compiled.get(source)
        if template is None:
            special = getattr(self._tok, "special_tokens_map", {})
            template = _compile(source, json.dumps(special, sort_keys=True))
            self._compiled[source] = template
        return template

    # ----- tokenisation ------------------------------------------------------------------------------

    def tokenize(self, text: str, cache: PrefixCache | None, call_id: str = "") -> RenderedPrompt:
        """Tokenise rendered text, reusing a cached prefix when safe."""
        return self._tokenize(text, cache, call_id, None).prompt

    def _tokenize(self, text: str, cache: PrefixCache | None, call_id: str, hint: CacheEntry | None) -> _Tokenized:
        if not self.incremental or cache is None:
            ids = self._full(text)
            return _Tokenized(RenderedPrompt(text, ids, 0, None), None)
        parent = cache.parent_of(text)
        if hint is not None:
            # The new text starts with the hint's text without its generation prompt (by construction).
            entry: CacheEntry | None = hint
            shared = hint.base_len + common_prefix_len(text[hint.base_len :], hint.text[hint.base_len :])
        else:
            entry, shared = cache.best(text)
        start_char, start_tok, start_json, k = 0, 0, 0, 0
        if entry is not None:
            k = bisect.bisect_right(entry.boundary_chars, shared)
            if k > 0:
                start_char = entry.boundary_chars[k - 1]
                start_tok, start_json = entry.boundary_tokens[k - 1], entry.boundary_json[k - 1]
        tail_ids, tail_chars, tail_toks = self._encode_with_boundaries(text[start_char:])
        tail_json, tail_offsets = ids_json(tail_ids, tail_toks)
        if entry is not None and start_tok:
            ids = entry.ids[:start_tok]  # a new list: one copy of the reused IDs, not two
            ids.extend(tail_ids)
            chars = entry.boundary_chars[:k] + [c + start_char for c in tail_chars]
            toks = entry.boundary_tokens[:k] + [t + start_tok for t in tail_toks]
            head_json = entry.ids_json[:start_json]
            joined = head_json + "," + tail_json if tail_json else head_json
            offsets = entry.boundary_json[:k] + [o + start_json + 1 for o in tail_offsets]
        else:
            ids, chars, toks, joined, offsets = tail_ids, tail_chars, tail_toks, tail_json, tail_offsets
        if self._verify and (ids != self._full(text) or joined != ids_json(ids, [])[0]):
            raise Internal("incremental tokenisation differs from a full tokenisation")
        new = CacheEntry(text, ids, joined, chars, toks, offsets, call_id)
        cache.add(new)
        return _Tokenized(RenderedPrompt(text, ids, start_tok, parent, joined), new)

    def _encode(self, text: str) -> Any:
        assert self._fast is not None
        if len(text) >= _GIL_FREE_CHARS:
            return self._fast.encode_batch([text], add_special_tokens=False)[0]
        return self._fast.encode(text, add_special_tokens=False)

    def _full(self, text: str) -> list[int]:
        if self._fast is not None:
            return list(self._encode(text).ids)
        return list(self._tok.encode(text, add_special_tokens=False))

    def _encode_with_boundaries(self, text: str) -> tuple[list[int], list[int], list[int]]:
        if self._fast is None:
            return self._full(text), [], []
        enc = self._encode(text)
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

    # ----- start-up probes ---------------------------------------------------------------------------

    def _probe_compiled(self) -> bool:
        """Check that the compiled template renders the probe conversations like ``apply_chat_template``."""
        try:
            for conversation in _probe_conversations():
                for specs in ([], [_PROBE_TOOL]):
                    conv, tool_dicts = _template_inputs(conversation, specs, self.supports_tools)
                    template = self._compiled_for(tool_dicts)
                    if template is None:
                        return False
                    fast = template.render(template_messages(conv), tool_dicts, True)[0]
                    if fast != self.reference_text(conversation, specs):
                        _log.warning("compiled chat template differs from apply_chat_template; not using it")
                        return False
        except Exception:  # a template that cannot render the probes keeps apply_chat_template
            return False
        return True

    def _probe_window(self) -> bool:
        """Check incremental rendering against full rendering on the probe conversations (cached per template)."""
        sources = set()
        for specs in ([], [_PROBE_TOOL]):
            template = self._compiled_for(_template_inputs([], specs, self.supports_tools)[1])
            if template is None:
                return False
            sources.add(template)
        ok = all(_append_only(t, self.supports_tools) for t in sources)
        if not ok:
            _log.warning("chat template is not append-only on probe conversations; rendering in full")
        return ok

    def _probe_tokenisation(self) -> bool:
        """Check the boundary rule on a small conversation; False disables incremental tokenisation."""
        turns = [
            ChatMessage("system", "Be brief.\n"),
            ChatMessage("user", " hello  there\n\n"),
            ChatMessage("assistant", "\n Hi!  ", reasoning="  ok "),
            ChatMessage("user", "\t\tmore  \n"),
        ]
        cache = PrefixCache(4)
        self.incremental = True
        try:
            for n in range(1, len(turns) + 1):
                text = self.reference_text(turns[:n], [])
                if self.tokenize(text, cache).token_ids != self._full(text):
                    return False
        except Exception:  # a template that cannot render the probe just disables the optimisation
            return False
        return True


@dataclasses.dataclass(slots=True)
class _Tokenized:
    prompt: RenderedPrompt
    entry: CacheEntry | None


def _window_start(messages: list[dict[str, Any]], end: int) -> tuple[int, int]:
    """``(s, j)``: the window is ``messages[:s] + messages[j:end...]``; ``j - s`` is even (role parity)."""
    s = 1 if messages and messages[0].get("role") == "system" else 0
    j = max(s, end - _WINDOW)
    if (j - s) % 2:
        j -= 1
    return s, j


def _window_covers_all(messages: list[dict[str, Any]]) -> bool:
    s, j = _window_start(messages, len(messages))
    return j == s


def _render_full(
    template: CompiledTemplate, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, want_base: bool
) -> _Text:
    """Render the whole conversation; with ``want_base``, also find where its generation prompt starts."""
    text, clock = template.render(messages, tools, True)
    base_len = -1
    if want_base and messages and _window_covers_all(messages):
        without, _ = template.render(messages, tools, False)
        base_len = len(without) if text.startswith(without) else -1
    elif want_base:
        base_len = _base_len(template, messages, tools, text)
    return _Text(text, base_len, clock, False)


def _extend(
    template: CompiledTemplate,
    old_messages: list[dict[str, Any]],
    old_text: str,
    old_base_len: int,
    old_clock: list[ClockReading],
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
) -> _Text | None:
    """Render ``messages`` by extending an earlier prompt whose messages start them; None when not safe."""
    if not clock_still_reads(old_clock):
        return None
    k = len(old_messages)
    s, j = _window_start(messages, k)
    old = messages[:s] + messages[j:k]
    new = messages[:s] + messages[j:]
    try:
        r0, c0 = template.render(old, tools, False)
        r1, c1 = template.render(new, tools, False)
        r1g, c2 = template.render(new, tools, True)
    except Exception:  # a window the template refuses (e.g. role alternation): render in full instead
        return None
    if not (r1.startswith(r0) and r1g.startswith(r1)):
        return None
    clock = _merge_clock(old_clock, c0, c1, c2)
    if clock is None:
        return None
    base = old_text[:old_base_len] + r1[len(r0) :]
    return _Text(base + r1g[len(r1) :], len(base), clock, True)


def _base_len(
    template: CompiledTemplate, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, text: str
) -> int:
    """Length of ``text`` (a full render) without its generation prompt, found on a window; -1 if unclear."""
    if not messages:
        return -1
    s, j = _window_start(messages, len(messages))
    window = messages[:s] + messages[j:]
    try:
        without, _ = template.render(window, tools, False)
        with_prompt, _ = template.render(window, tools, True)
    except Exception:
        return -1
    if not with_prompt.startswith(without):
        return -1
    suffix = len(with_prompt) - len(without)
    if not text.endswith(with_prompt[len(without) :]):
        return -1
    return len(text) - suffix


def _template_inputs(
    messages: list[ChatMessage], tools: list[ToolSpec], supports_tools: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    if tools and not supports_tools:
        return fallback_messages(messages, tools), None
    return [m.to_template_dict() for m in messages], [t.to_template_dict() for t in tools] or None


@functools.lru_cache(maxsize=16)
def _compile(source: str, special_tokens_json: str) -> CompiledTemplate:
    """Compile a template once per process (like transformers' own cache)."""
    return CompiledTemplate(source, json.loads(special_tokens_json))


@functools.lru_cache(maxsize=16)
def _append_only(template: CompiledTemplate, supports_tools: bool) -> bool:
    """Whether incremental rendering equals full rendering on every step of the probe conversations."""
    for conversation in _probe_conversations():
        for specs in ([], [_PROBE_TOOL]):
            prev: _Text | None = None
            prev_messages: list[dict[str, Any]] = []
            for n in range(1, len(conversation) + 1):
                conv, tools = _template_inputs(conversation[:n], specs, supports_tools)
                messages = template_messages(conv)
                try:
                    full, clock = template.render(messages, tools, True)
                except Exception:  # e.g. a template that insists on alternating roles: not a valid probe
                    break
                got = None
                if prev is not None and messages[: len(prev_messages)] == prev_messages:
                    got = _extend(template, prev_messages, prev.text, prev.base_len, prev.clock, messages, tools)
                    if got is not None and got.text != full:
                        return False
                if got is None:
                    got = _Text(full, _base_len(template, messages, tools, full), clock, False)
                    if got.base_len >= 0:
                        no_prompt, _ = template.render(messages, tools, False)
                        if no_prompt != full[: got.base_len]:
                            return False
                prev, prev_messages = (got, messages) if got.base_len >= 0 else (None, [])
    return True


def _merge_clock(*groups: list[ClockReading]) -> list[ClockReading] | None:
    seen: dict[str, str] = {}
    for group in groups:
        for fmt, value in group:
            if seen.setdefault(fmt, value) != value:
                return None  # the clock ticked between renders
    return list(seen.items())


_PROBE_TOOL = ToolSpec(
    "probe_tool", "A probe.", {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
)


def _probe_conversations() -> list[list[ChatMessage]]:
    """Growing conversations that exercise role changes, reasoning, tool calls and consecutive tool results."""
    rng = random.Random(7)

    def assistant(i: int) -> ChatMessage:
        calls = [ToolCall(f"c{i}_{n}", "probe_tool", {"path": f"f{i}{n}.py"}) for n in range(rng.randrange(3))]
        reasoning = rng.choice([None, f"think {i}", " spaced\n"])
        return ChatMessage("assistant", rng.choice(["", f"Answer {i}.", "\nlead"]), calls, reasoning=reasoning)

    conversations = [
        [
            ChatMessage("system", "Be brief."),
            ChatMessage("user", "hi"),
            ChatMessage("assistant", "a1", reasoning="r1"),
            ChatMessage("user", "again"),
            ChatMessage("assistant", "a2"),
            ChatMessage("user", "once more"),
            ChatMessage("assistant", "a3", reasoning="r3"),
            ChatMessage("user", "last"),
        ],
        [
            ChatMessage("user", "read two files"),
            ChatMessage("assistant", "", [ToolCall("a", "probe_tool", {"path": "x"})], reasoning="plan"),
            ChatMessage("tool", "one", tool_call_id="a", name="probe_tool"),
            ChatMessage("assistant", "", [ToolCall("b", "probe_tool", {"path": "y"})]),
            ChatMessage("tool", "two", tool_call_id="b", name="probe_tool"),
            ChatMessage("tool", "three", tool_call_id="b", name="probe_tool"),
            ChatMessage("assistant", "done"),
            ChatMessage("user", "thanks"),
        ],
    ]
    for c in range(6):
        msgs: list[ChatMessage] = [ChatMessage("system", f"sys {c}")] if c % 2 == 0 else []
        msgs.append(ChatMessage("user", f"task {c}"))
        for i in range(4):
            msgs.append(assistant(i))
            calls = msgs[-1].tool_calls
            if calls:
                msgs += [ChatMessage("tool", f"out {i}", tool_call_id=t.id, name=t.name) for t in calls]
            else:
                msgs.append(ChatMessage("user", f"more {i}"))
        conversations.append(msgs)
    return conversations


def _template_text(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):
        return template
    if isinstance(template, dict):
        return " ".join(str(v) for v in template.values())
    return ""
