"""A chat template compiled once and rendered directly, the way ``apply_chat_template`` renders it.

``tokenizer.apply_chat_template(..., tokenize=False)`` normalises and deep-copies the whole conversation on
every call before rendering it. :class:`CompiledTemplate` builds the same Jinja environment as transformers
(immutable sandbox, ``trim_blocks``/``lstrip_blocks``, ``loopcontrols``, the ``{% generation %}`` tag, the
``tojson`` filter and the ``raise_exception``, ``strftime_now``, ``dict`` and ``namespace`` globals) and passes
the same variables (``messages``, ``tools``, ``documents``, ``add_generation_prompt`` and the special tokens),
so the text is the same; :class:`~model_proxy.core.render.ChatRenderer` checks that on probe conversations
at start-up and falls back to ``apply_chat_template`` when it is not.

``strftime_now`` is the only input a template can read that is not an argument; every call it makes is
recorded as a :data:`ClockReading`, so a cached rendering can be reused only while the clock still reads the
same (a template that prints today's date must not keep yesterday's).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["ClockReading", "CompiledTemplate", "clock_still_reads", "template_message", "template_messages"]

ClockReading = tuple[str, str]
"""``(format, value)`` of one ``strftime_now(format)`` call made by a template."""

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_REASONING_KEYS = frozenset(_REASONING_FIELDS)


class _Generation(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` renders its body (transformers uses it for assistant masks)."""

    tags = {"generation"}  # noqa: RUF012 (the type is set by jinja2.ext.Extension)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller: Any) -> Any:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # transformers' override: Jinja's own tojson escapes HTML characters.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _MemoJson:
    """``tojson`` remembering the text of recently serialised dicts and lists by identity.

    The window renders of one call, and every call that extends a cached prompt, pass the very same tool dicts
    (:meth:`~model_proxy.core.render.ChatRenderer.render` reuses the cached entry's equal ones), so a template
    that prints 25 tool schemas with ``tojson`` serialises them once per session, not three times per call.
    Entries hold their object, so an id is never reused while remembered; template values are never mutated
    (the sandbox is immutable and the renderer builds fresh dicts for every new message).
    """

    _MAX = 1024

    def __init__(self) -> None:
        self._memo: dict[tuple[int, Any, Any, Any, bool], tuple[Any, str]] = {}

    def __call__(
        self, x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        if not isinstance(x, dict | list):
            return _tojson(x, ensure_ascii, indent, separators, sort_keys)
        key = (id(x), ensure_ascii, indent, None if separators is None else tuple(separators), sort_keys)
        hit = self._memo.get(key)
        if hit is not None and hit[0] is x:
            return hit[1]
        text = _tojson(x, ensure_ascii, indent, separators, sort_keys)
        if len(self._memo) >= self._MAX:
            self._memo.clear()  # threads may race here: at worst a text is computed twice
        self._memo[key] = (x, text)
        return text


class _TemplateDict:
    """``dict(...)`` without attribute access to the type itself (as in transformers)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """A namespace that refuses underscore-prefixed attributes (as in transformers)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set underscore attributes ({name!r})")


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _MemoJson()
    env.globals["raise_exception"] = _raise_exception
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Prepare message dicts as ``apply_chat_template`` does: drop None values, alias reasoning fields."""
    return [template_message(message) for message in messages]


def template_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """One message of :func:`template_messages` (a new dict)."""
    item = {k: v for k, v in message.items() if v is not None}
    if not _REASONING_KEYS.isdisjoint(item):  # rare: most messages carry no reasoning (no generator per message)
        reasoning = next((item[k] for k in _REASONING_FIELDS if k in item), None)
        if reasoning is not None:
            item = {"thinking": reasoning, **item, "reasoning_content": reasoning}
    return item


class CompiledTemplate:
    """One chat template, compiled once."""

    def __init__(self, source: str, special_tokens: Mapping[str, Any]) -> None:
        """Compile ``source``.

        Args:
            source: The Jinja chat template.
            special_tokens: The tokenizer's ``special_tokens_map`` (passed to the template as variables).
        """
        self.source = source
        self._template = _environment().from_string(source)
        self._special = dict(special_tokens)

    def render(
        self, messages: Sequence[Mapping[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool
    ) -> tuple[str, list[ClockReading]]:
        """Render ``messages`` (already prepared by :func:`template_messages`); returns text and clock readings."""
        readings: list[ClockReading] = []

        def strftime_now(fmt: str) -> str:
            value = datetime.now().strftime(fmt)
            readings.append((fmt, value))
            return value

        text = self._template.render(
            **self._special,
            messages=messages,
            tools=tools,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            strftime_now=strftime_now,
        )
        return text, readings


def clock_still_reads(readings: Sequence[ClockReading]) -> bool:
    """Whether every ``strftime_now`` reading would come out the same now."""
    if not readings:
        return True
    now = datetime.now()
    return all(now.strftime(fmt) == value for fmt, value in readings)
