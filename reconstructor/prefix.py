"""Vectorised token-sequence comparisons used by the merge strategies.

Token sequences are held as contiguous ``int32`` numpy arrays, converted once per completion (see
:class:`reconstructor.chains.PreparedCall`), so that each prefix test is one vectorised comparison instead of
a Python-level loop. Agentic sessions compare long prompts (tens of thousands of tokens) against every open
chain, which makes this the hot path of reconstruction (see ``bench/reconstruct``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["TokenArray", "as_tokens", "common_prefix_length", "equal_tokens", "find_first_of", "is_prefix"]

TokenArray = npt.NDArray[np.int32]


def as_tokens(ids: Sequence[int] | Iterable[int] | TokenArray) -> TokenArray:
    """Return ``ids`` as a contiguous 1-D ``int32`` array (no copy when it already is one).

    Args:
        ids: Token IDs as a list, any iterable of ints or an array.

    Returns:
        A 1-D ``int32`` array.
    """
    if isinstance(ids, np.ndarray):
        return np.ascontiguousarray(ids, dtype=np.int32).reshape(-1)
    if isinstance(ids, Sequence):
        # fromiter with a known count is the fastest conversion of a list of Python ints (~75 M/s).
        return np.fromiter(ids, dtype=np.int32, count=len(ids))
    return np.fromiter(ids, dtype=np.int32)


def equal_tokens(a: TokenArray, b: TokenArray) -> bool:
    """Return whether two ``int32`` arrays of the same length are equal (one vectorised pass)."""
    return bool((a == b).all())


def is_prefix(prefix: TokenArray, seq: TokenArray, *, strict: bool = False) -> bool:
    """Return whether ``prefix`` equals the first ``len(prefix)`` tokens of ``seq``.

    Args:
        prefix: The candidate prefix.
        seq: The sequence it should start.
        strict: Also require ``seq`` to be longer than ``prefix``.

    Returns:
        True when ``seq[:len(prefix)] == prefix`` (and, with ``strict``, ``len(seq) > len(prefix)``).
    """
    n = prefix.shape[0]
    if n > seq.shape[0] or (strict and n == seq.shape[0]):
        return False
    if n == 0:
        return True
    # Cheap rejections first: sequences that diverge usually differ at the start, the end or the middle.
    if prefix[0] != seq[0] or prefix[n - 1] != seq[n - 1] or prefix[n >> 1] != seq[n >> 1]:
        return False
    return equal_tokens(prefix, seq[:n])


def common_prefix_length(a: TokenArray, b: TokenArray) -> int:
    """Return the length of the longest common prefix of ``a`` and ``b``."""
    n = min(a.shape[0], b.shape[0])
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def find_first_of(seq: TokenArray, ids: TokenArray) -> int:
    """Return the index of the first token of ``seq`` that is in ``ids``, or -1 when there is none."""
    if seq.shape[0] == 0 or ids.shape[0] == 0:
        return -1
    hits = seq == ids[0] if ids.shape[0] == 1 else np.isin(seq, ids)
    found = np.flatnonzero(hits)
    return int(found[0]) if found.size else -1
