import pytest

from kvparse import parse_settings


def test_basic():
    assert parse_settings("a=1; b=2") == {"a": "1", "b": "2"}


def test_trailing_separator_and_spaces():
    assert parse_settings("  a = x ;; ") == {"a": "x"}


def test_value_containing_equals():
    assert parse_settings("token=abc==; mode=fast") == {"token": "abc==", "mode": "fast"}


def test_missing_equals_is_an_error():
    with pytest.raises(ValueError):
        parse_settings("novalue")
