"""Shared foundation of the Polar services: errors, records, settings, gRPC server plumbing and tracing."""

from __future__ import annotations

__all__: list[str] = []
