"""gRPC message limits shared by every server and channel (one setting: ``max_message_bytes``).

gRPC's own default receive limit is 4 MiB, which a long session reaches: the completions of a 60-call session
growing to 32k tokens, or its per-request traces, are tens of megabytes. Every Polar server and channel uses
the same, generous limit instead; what grows with a session is also paged by size
(:func:`within_budget`), so no single message has to approach it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol, TypeVar

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_PAGE_BYTES",
    "chunk_budget",
    "chunked",
    "message_options",
    "within_budget",
]

DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024 * 1024
"""The receive/send limit of every server and channel unless a service's settings say otherwise."""

DEFAULT_PAGE_BYTES = 4 * 1024 * 1024
"""The byte budget of one page of what grows with a session (completions, session results)."""


class _Sized(Protocol):
    def ByteSize(self) -> int: ...


_M = TypeVar("_M", bound=_Sized)


def message_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """The gRPC channel/server options that set both message limits to ``max_message_bytes``."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
    ]


def within_budget(messages: Iterable[_M], max_bytes: int) -> Iterator[_M]:
    """The leading ``messages`` whose serialized sizes add up to at most ``max_bytes``.

    The first message is always yielded, however large, so a paged read always advances; the iterable is
    consumed lazily, one message past the budget at most.
    """
    total = 0
    for index, message in enumerate(messages):
        total += message.ByteSize()
        if index and total > max_bytes:
            return
        yield message


def chunk_budget(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> int:
    """The byte budget of one page or chunk on a hop limited to ``max_message_bytes``.

    Half the limit (at most :data:`DEFAULT_PAGE_BYTES`), so a page that stops just under its budget, plus its
    framing and the one message it may hold past the budget, still fits in a message.
    """
    return max(1, min(DEFAULT_PAGE_BYTES, max_message_bytes // 2))


def chunked(messages: Iterable[_M], max_bytes: int) -> Iterator[list[_M]]:
    """Split ``messages`` into consecutive chunks whose serialized sizes add up to at most ``max_bytes``.

    A message larger than the budget is a chunk of its own; an empty iterable gives no chunk.
    """
    chunk: list[_M] = []
    total = 0
    for message in messages:
        size = message.ByteSize()
        if chunk and total + size > max_bytes:
            yield chunk
            chunk, total = [], 0
        chunk.append(message)
        total += size
    if chunk:
        yield chunk
