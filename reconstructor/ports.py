"""The reconstructor's seam: where the servicer reads the completions a ``ProxySource`` names."""

from __future__ import annotations

from typing import Protocol

from polar_core.records import CompletionRecord

__all__ = ["CompletionSource"]


class CompletionSource(Protocol):
    """Where the servicer reads completions named by a ``ProxySource`` (a real proxy, or a test's fake)."""

    async def list_completions(self, proxy_target: str, session_id: str) -> list[CompletionRecord]:
        """Return every completion of ``session_id`` held by the proxy at ``proxy_target``."""
        ...
