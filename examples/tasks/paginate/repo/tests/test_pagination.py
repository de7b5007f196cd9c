import pytest

from pagination import page_count, page_items


def test_exact_multiple():
    assert page_count(20, 10) == 2


def test_empty():
    assert page_count(0, 10) == 0


def test_partial_last_page():
    assert page_count(21, 10) == 3


def test_single_partial_page():
    assert page_count(3, 10) == 1


def test_page_items():
    items = list(range(25))
    assert page_items(items, 3, 10) == [20, 21, 22, 23, 24]


def test_bad_per_page():
    with pytest.raises(ValueError):
        page_count(5, 0)
