"""Every protobuf ↔ domain conversion of the ModelProxyService (completion records: :mod:`polar_core.convert`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from polar.proxy.v1 import model_proxy_service_pb2 as pb

from model_proxy.models import ServedPolicy
from polar_core.convert import completion_to_proto, struct_to_dict
from polar_core.durations import seconds
from polar_core.errors import InvalidArgument
from polar_core.limits import DEFAULT_PAGE_BYTES, within_budget
from polar_core.policy_version import is_wire_version, parse_version
from polar_core.records import CompletionRecord

__all__ = [
    "Page",
    "completions_page_to_proto",
    "drain_timeout_from_proto",
    "open_session_response",
    "page_from_proto",
    "served_policy_to_proto",
    "session_metadata",
    "watch_response",
]

_DEFAULT_PAGE = 100
_MAX_PAGE = 1000

Page = tuple[int, int, int]
"""A page of a session's completions: ``(start, size, max_bytes)``."""


def session_metadata(request: pb.OpenSessionRequest) -> dict[str, Any]:
    """The session metadata of an ``OpenSessionRequest`` as a plain dict (empty when unset)."""
    return struct_to_dict(request.metadata) if request.HasField("metadata") else {}


def open_session_response(token: str, base_url: str) -> pb.OpenSessionResponse:
    """The token and the provider base URLs (Anthropic and Google at the root, OpenAI under ``/v1``)."""
    return pb.OpenSessionResponse(
        session_token=token,
        anthropic_base_url=base_url,
        openai_base_url=f"{base_url}/v1",
        google_base_url=base_url,
    )


def page_from_proto(request: pb.ListCompletionsRequest) -> Page:
    """The page a ``ListCompletionsRequest`` asks for (count and byte budget).

    Raises:
        InvalidArgument: A malformed page token, a negative page size or a negative byte budget.
    """
    try:
        start = int(request.page_token) if request.page_token else 0
    except ValueError:
        raise InvalidArgument("malformed page_token") from None
    if start < 0:
        raise InvalidArgument("malformed page_token")
    size = min(request.page_size or _DEFAULT_PAGE, _MAX_PAGE)
    if size < 0:
        raise InvalidArgument("page_size must not be negative")
    if request.max_page_bytes < 0:
        raise InvalidArgument("max_page_bytes must not be negative")
    return start, size, request.max_page_bytes or DEFAULT_PAGE_BYTES


def completions_page_to_proto(records: Sequence[CompletionRecord], page: Page) -> pb.ListCompletionsResponse:
    """One page of ``records``: at most ``size`` completions within the byte budget (at least one), with the
    token of the next page (empty after the last)."""
    start, size, max_bytes = page
    chosen = list(within_budget((completion_to_proto(r) for r in records[start : start + size]), max_bytes))
    end = start + len(chosen)
    return pb.ListCompletionsResponse(completions=chosen, next_page_token=str(end) if end < len(records) else "")


def watch_response(record: CompletionRecord) -> pb.WatchCompletionsResponse:
    """One streamed completion of ``WatchCompletions``."""
    return pb.WatchCompletionsResponse(completion=completion_to_proto(record))


def drain_timeout_from_proto(request: pb.PauseGenerationRequest) -> float | None:
    """The drain limit a PauseGeneration request asks for; ``None`` when it names none (the proxy's default)."""
    if not request.HasField("drain_timeout"):
        return None
    drain = seconds(request.drain_timeout)
    return drain if drain > 0 else None


def policy_version_from_proto(text: str) -> int:
    """The version a SetPolicyVersion or LoadWeights request names.

    Raises:
        InvalidArgument: ``text`` is not the wire form of a version (decimal digits): a label such as ``"v2"``
            would read back as the initial policy wherever a lag is measured.
    """
    if not is_wire_version(text):
        raise InvalidArgument(f"policy_version must be a non-negative integer in decimal digits, not {text!r}")
    return parse_version(text)


def served_policy_to_proto(served: ServedPolicy) -> pb.GetPolicyResponse:
    """A proxy's GetPolicy answer."""
    return pb.GetPolicyResponse(
        policy_version=served.policy_version,
        weights_path=served.weights_path,
        paused=served.paused,
        in_flight=served.in_flight,
    )
