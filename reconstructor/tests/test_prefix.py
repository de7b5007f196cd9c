from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from reconstructor.prefix import as_tokens, equal_tokens

ids = st.lists(st.integers(0, 5), max_size=20)


def test_as_tokens_accepts_lists_iterables_and_arrays():
    assert as_tokens([1, 2]).dtype == np.int32
    assert as_tokens(iter([1, 2])).tolist() == [1, 2]
    arr = np.arange(3, dtype=np.int32)
    assert np.shares_memory(as_tokens(arr), arr)


@given(a=ids, b=ids)
def test_equal_tokens_matches_list_equality_for_equal_lengths(a, b):
    n = min(len(a), len(b))
    assert equal_tokens(as_tokens(a[:n]), as_tokens(b[:n])) == (a[:n] == b[:n])
