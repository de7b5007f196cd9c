"""The policy version: one parser, one formatter, one rule for the initial policy."""

from __future__ import annotations

import pytest

from polar_core.policy_version import INITIAL, format_version, is_wire_version, parse_version, version_key


@pytest.mark.parametrize(("text", "version"), [("0", 0), ("1", 1), ("12", 12), ("007", 7)])
def test_decimal_digits_are_the_version(text: str, version: int) -> None:
    assert parse_version(text) == version


@pytest.mark.parametrize("text", ["", "base", "v3", "step-2", "-1", "2.0", " 2", "2 ", "٣", "+2"])
def test_anything_else_is_the_initial_policy(text: str) -> None:
    assert INITIAL == 0
    assert parse_version(text) == INITIAL


@pytest.mark.parametrize("version", [0, 1, 42, 2**63 - 1])
def test_the_wire_form_reads_back_as_the_same_version(version: int) -> None:
    text = format_version(version)
    assert text == str(version)
    assert is_wire_version(text)
    assert parse_version(text) == version


@pytest.mark.parametrize("bad", [-1, True, 1.0, "1"])
def test_only_a_non_negative_integer_has_a_wire_form(bad: object) -> None:
    with pytest.raises(ValueError, match="non-negative integer"):
        format_version(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["", "v1", "07", "-1", "1.0", " 1", "٣"])
def test_only_the_exact_wire_form_is_a_wire_version(text: str) -> None:
    assert not is_wire_version(text)


def test_versions_sort_by_number_then_text() -> None:
    texts = ["10", "9", "base", "2", "", "v1"]
    assert sorted(texts, key=version_key) == ["", "base", "v1", "2", "9", "10"]
