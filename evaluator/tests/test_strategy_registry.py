"""The strategy registry: names (including those promised to users) → factories, no alias table, no if-chain."""

from __future__ import annotations

import pytest

from evaluator.errors import UnknownStrategy
from evaluator.models import EvaluatorSpec
from evaluator.strategies import (
    STRATEGIES,
    CommandStrategy,
    CustomStrategy,
    SessionCompletedStrategy,
    SweStrategy,
    build_strategy,
)


def test_the_names_users_were_given_are_registered_names_of_the_same_strategies() -> None:
    # task.proto's EvaluatorSpec comment and docs/evaluator.md name these.
    assert STRATEGIES["swe_bench"] is STRATEGIES["swe"] is SweStrategy
    assert STRATEGIES["script"] is STRATEGIES["command"] is CommandStrategy
    assert STRATEGIES["none"] is STRATEGIES["session_completed"] is SessionCompletedStrategy


@pytest.mark.parametrize("name", ["none", "session_completed"])
def test_a_registered_name_builds_its_strategy(name: str) -> None:
    assert isinstance(build_strategy(EvaluatorSpec(name)), SessionCompletedStrategy)


def test_an_unknown_name_is_refused_listing_every_registered_one() -> None:
    with pytest.raises(UnknownStrategy) as info:
        build_strategy(EvaluatorSpec("nope"))
    for name in STRATEGIES:
        assert name in info.value.message
    assert info.value.message.startswith("unknown evaluator strategy 'nope'; known: swe, swebench,")


def test_module_callable_names_and_custom_build_a_custom_strategy() -> None:
    direct = build_strategy(EvaluatorSpec("evaluator.tests.test_strategy_registry:_reward"))
    named = build_strategy(EvaluatorSpec("custom", {"callable": "evaluator.tests.test_strategy_registry:_reward"}))
    assert isinstance(direct, CustomStrategy)
    assert isinstance(named, CustomStrategy)
    with pytest.raises(UnknownStrategy, match=r"options\.callable"):
        build_strategy(EvaluatorSpec("custom"))


def _reward(*_: object) -> float:
    return 1.0
