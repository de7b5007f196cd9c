"""``Registry``: the one shape of the extension points (protocols, evaluator strategies, harnesses)."""

from __future__ import annotations

import pytest

from polar_core.errors import InvalidArgument
from polar_core.registry import Registry


class _Unknown(InvalidArgument):
    pass


def test_a_name_given_twice_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="'a' is registered twice"):
        Registry("thing", [("a", 1), ("b", 2), ("a", 3)])


def test_an_empty_name_is_refused() -> None:
    with pytest.raises(ValueError, match="needs a name"):
        Registry("thing", [("", 1)])


def test_an_unknown_name_lists_the_known_ones_in_order() -> None:
    things = Registry("thing", [("b", 2), ("a", 1)], unknown=_Unknown)
    with pytest.raises(_Unknown) as info:
        things.get_or_raise("c", details={"field": "thing"})
    assert info.value.message == "unknown thing 'c'; known: b, a"
    assert info.value.details == {"field": "thing"}


def test_it_is_an_ordered_read_only_mapping() -> None:
    things = Registry("thing", [("b", 2), ("a", 1)])
    assert things.names() == ("b", "a") == tuple(things)
    assert things["a"] == things.get_or_raise("a") == 1
    assert dict(things) == {"b": 2, "a": 1}
    assert "c" not in things
    assert len(things) == 2
    with pytest.raises(TypeError):
        things["c"] = 3  # type: ignore[index]
