"""The policy version: one type from the trainer to the recorded call.

A policy version is a non-negative integer. The trainer numbers its updates 1, 2, 3, ... (``UpdatePolicy``'s
``int64 version``); :data:`INITIAL` (0) is the policy a proxy serves before any update, the weights it was started
with. Records carry the version as text (the completion record's ``policy_version`` and the trace's
``policy_versions`` are strings in the released contracts, as are the proxy's ``LoadWeights`` and
``SetPolicyVersion`` fields), and that text is the version's decimal digits (:func:`format_version`).

The one rule for reading a version back (:func:`parse_version`): text that is not decimal digits (an empty
version, or a label such as ``"base"`` an operator gave the startup weights in the proxy's settings) is the
initial policy. Only the startup weights can carry such a label, since every update is numbered; and counting an
unknown version as the oldest can only over-estimate a lag, never hide one. Where a version comes in through an
API (``SetPolicyVersion``, ``LoadWeights``), :func:`is_wire_version` lets the edge refuse anything but the exact
wire form, so a version set on purpose is never silently read as the initial one.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["INITIAL", "format_version", "is_wire_version", "parse_version", "version_key"]

INITIAL: Final = 0
"""The initial policy: the weights a proxy serves before any update."""

_DIGITS = re.compile(r"[0-9]+")
_WIRE = re.compile(r"0|[1-9][0-9]*")


def parse_version(text: str) -> int:
    """The version ``text`` names: its decimal digits as a number, or :data:`INITIAL` for anything else.

    Only ASCII digits count (``"٣"`` is not a version), and ``"007"`` reads as 7.
    """
    return int(text) if _DIGITS.fullmatch(text) else INITIAL


def format_version(version: int) -> str:
    """The wire form of ``version``: its decimal digits.

    Raises:
        ValueError: ``version`` is negative (or not an ``int``).
    """
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"a policy version is a non-negative integer, not {version!r}")
    return str(version)


def is_wire_version(text: str) -> bool:
    """Whether ``text`` is exactly the wire form of a version (``"0"``, ``"12"``; not ``""``, ``"v1"``, ``"07"``)."""
    return _WIRE.fullmatch(text) is not None


def version_key(text: str) -> tuple[int, str]:
    """Sort key for version texts: by the version they name, then by the text (so labels order stably)."""
    return parse_version(text), text
