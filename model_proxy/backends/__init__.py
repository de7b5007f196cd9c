"""Inference backends of the model proxy."""

from __future__ import annotations

from model_proxy.backends.base import Backend

__all__ = ["Backend"]
