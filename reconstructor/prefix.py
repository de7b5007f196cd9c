"""Vectorised token-sequence comparisons used by the merge strategies (:mod:`reconstructor.chains`).

Token sequences are held as contiguous ``int32`` numpy arrays, converted once per completion (see
:class:`reconstructor.chains.PreparedCall`), so that each prefix test is one vectorised comparison instead of
a Python-level loop. Agentic sessions compare long prompts (tens of thousands of tokens) against every open
chain, which makes this the hot path of reconstruction (see ``bench/reconstruct``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["TokenArray", "as_tokens", "equal_tokens"]

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
