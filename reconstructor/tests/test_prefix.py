from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from reconstructor.prefix import as_tokens, common_prefix_length, equal_tokens, find_first_of, is_prefix

ids = st.lists(st.integers(0, 5), max_size=20)


@given(a=ids, b=ids)
def test_is_prefix_matches_list_semantics(a, b):
    assert is_prefix(as_tokens(a), as_tokens(b)) == (b[: len(a)] == a)
    assert is_prefix(as_tokens(a), as_tokens(b), strict=True) == (b[: len(a)] == a and len(b) > len(a))


@given(a=ids, b=ids)
def test_common_prefix_length_matches_a_loop(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert common_prefix_length(as_tokens(a), as_tokens(b)) == n


@given(seq=ids, targets=st.lists(st.integers(0, 5), max_size=3))
def test_find_first_of_matches_a_loop(seq, targets):
    expected = next((i for i, t in enumerate(seq) if t in targets), -1)
    assert find_first_of(as_tokens(seq), as_tokens(targets)) == expected


def test_as_tokens_accepts_lists_iterables_and_arrays():
    assert as_tokens([1, 2]).dtype == np.int32
    assert as_tokens(iter([1, 2])).tolist() == [1, 2]
    arr = np.arange(3, dtype=np.int32)
    assert np.shares_memory(as_tokens(arr), arr)


@given(a=ids, b=ids)
def test_equal_tokens_matches_list_equality_for_equal_lengths(a, b):
    n = min(len(a), len(b))
    assert equal_tokens(as_tokens(a[:n]), as_tokens(b[:n])) == (a[:n] == b[:n])
