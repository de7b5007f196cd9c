"""The google protocol adapter: wire models and translation."""

from __future__ import annotations

from model_proxy.protocols.google.adapter import GoogleAdapter

__all__ = ["GoogleAdapter"]
