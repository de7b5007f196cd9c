"""``check_harness``: the submission-time check of a harness name and its option keys, without a session, against
the catalogue the adapters declare their options from."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest

from gateway.harnesses import ADAPTERS, HarnessContext, ProxyEndpoints, adapter_names, get_adapter
from polar_checks.harnesses import COMMON_OPTIONS, HARNESS_OPTIONS, check_harness, harness_names
from polar_core.errors import InvalidArgument

_ENDPOINTS = ProxyEndpoints(
    token="t", anthropic_base_url="http://p", openai_base_url="http://p/v1", google_base_url="http://p"
)


def _context(options: dict[str, object]) -> HarnessContext:
    root = PurePosixPath("/s")
    return HarnessContext(
        home=root / "home", workspace=root / "ws", tmp=root / "tmp", instruction="i", endpoints=_ENDPOINTS,
        model="m", options=options,
    )  # fmt: skip


def test_the_catalogue_names_exactly_the_adapters_the_gateway_has() -> None:
    # What the client and the rollout server accept is what a gateway can run, and nothing more.
    assert sorted(harness_names()) == sorted(adapter_names())
    for name in adapter_names():
        assert get_adapter(name).option_names == HARNESS_OPTIONS[name]


@pytest.mark.parametrize("name", adapter_names())
def test_every_adapter_declares_its_options_and_the_common_ones_pass(name: str) -> None:
    names = get_adapter(name).option_names
    assert isinstance(names, frozenset)
    assert not names & COMMON_OPTIONS
    check_harness(name, dict.fromkeys(names | COMMON_OPTIONS))


@pytest.mark.parametrize("name", adapter_names())
def test_an_unknown_option_is_refused_here_and_by_prepare_with_the_field(name: str) -> None:
    with pytest.raises(InvalidArgument) as at_submission:
        check_harness(name, {"no_such_option": 1})
    assert at_submission.value.details == {"harness": name, "field": "harness.no_such_option"}
    with pytest.raises(InvalidArgument) as at_prepare:
        get_adapter(name).prepare(_context({"no_such_option": 1}))
    assert at_prepare.value.details == at_submission.value.details


def test_an_unknown_harness_is_refused_with_the_field() -> None:
    with pytest.raises(InvalidArgument, match="claude_code") as info:
        check_harness("claude_code", {})
    assert info.value.details == {"field": "harness.name", "harness": "claude_code"}


def test_each_adapter_is_registered_under_its_own_name_spelled_with_hyphens() -> None:
    for name, factory in ADAPTERS.items():
        assert factory().name == name
        # polar run reads `_` as `-` (polar_run.run_config.harness_name); that needs no `_` in a registered name.
        assert "_" not in name


def test_an_unknown_adapter_name_lists_the_known_ones() -> None:
    with pytest.raises(InvalidArgument) as info:
        get_adapter("claude")
    assert info.value.details == {"harness": "claude"}
    assert info.value.message == f"unknown harness 'claude'; known: {', '.join(adapter_names())}"
