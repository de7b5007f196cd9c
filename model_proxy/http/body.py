"""Reading and decoding a request body: size-limited while it arrives, strict UTF-8 JSON, no lone surrogates.

The limit holds however the body is sent: a declared ``Content-Length`` over it is refused before anything is
read, and a chunked (or lying) body is counted while it arrives and refused as soon as it passes the limit,
so a harness can never make the proxy buffer more than ``max_body_bytes``. The JSON must be UTF-8 (no other
encoding is guessed, no invalid byte replaced), has no ``NaN``/``Infinity`` and no number out of range, and
no string (key or value) may hold a lone UTF-16 surrogate: ``json.loads`` accepts ``"\\ud800"`` escapes, and
such a string cannot be written to a completion record (or sent to a tokenizer) later, after generation.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from starlette.requests import ClientDisconnect, Request

from model_proxy.core.body_memo import BodyMemo, decode_with_memo, scanner
from model_proxy.errors import MalformedRequest, RequestTooLarge

__all__ = ["decode_json", "has_lone_surrogate", "read_body"]

# A \u escape of a UTF-16 surrogate (D800-DFFF); only such an escape can put one in a decoded string, since
# strict UTF-8 decoding refuses encoded surrogates. A pair decodes to one character and is fine.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
_SURROGATE = re.compile("[\ud800-\udfff]")


async def read_body(request: Request, limit: int) -> bytes:
    """Read the whole body, refusing it as soon as it is known to be larger than ``limit`` bytes.

    Raises:
        RequestTooLarge: The declared or the received size is over ``limit``.
        MalformedRequest: A malformed ``Content-Length`` or a body that ended early.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise MalformedRequest("malformed Content-Length")
        if int(declared) > limit:
            raise RequestTooLarge(f"request body is larger than {limit} bytes")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise RequestTooLarge(f"request body is larger than {limit} bytes")
    except ClientDisconnect:
        raise MalformedRequest("the request body ended early") from None
    return bytes(body)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError("number out of range")
    return value


_SCAN = scanner(json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float))


def decode_json(body: bytes, memo: BodyMemo | None = None) -> Any:
    """Decode a JSON body strictly (CPU-bound: callers run large bodies in a worker thread).

    ``memo`` is the session's :class:`~model_proxy.http.body_memo.BodyMemo`: the elements of top-level arrays
    whose text is the last body's are not decoded again (the same value either way).

    Raises:
        MalformedRequest: Not UTF-8, not JSON, nested too deeply, or a string holds a lone surrogate.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedRequest(f"request body is not valid UTF-8 (byte {exc.start})") from None
    try:
        value = decode_with_memo(text, memo, _SCAN) if memo is not None else None
        if value is None:
            value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except (ValueError, RecursionError):
        raise MalformedRequest("request body is not valid JSON") from None
    if _SURROGATE_ESCAPE.search(body) is not None and has_lone_surrogate(value):
        raise MalformedRequest("request body holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape)")
    return value


def has_lone_surrogate(value: Any) -> bool:
    """Whether any string in a decoded JSON value (keys included) holds a lone surrogate (iterative: no depth
    limit)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item) is not None:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False
