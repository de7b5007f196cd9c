"""The evaluator strategy registry: strategy name (as in task files) → a factory taking the strategy's options.

Adding a strategy is a new module in this package and one line in :data:`STRATEGIES` (``docs/extending.md``).
A name absent here that holds a ``:`` is a custom evaluator (``module:callable``, :class:`CustomStrategy`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from evaluator.errors import UnknownStrategy
from evaluator.models import EvaluatorSpec
from evaluator.ports import Strategy
from evaluator.strategies.command import CommandStrategy
from evaluator.strategies.custom import CustomStrategy
from evaluator.strategies.harbor import HarborStrategy
from evaluator.strategies.simple import SessionCompletedStrategy
from evaluator.strategies.swe import SweStrategy
from evaluator.strategies.swebench import SwebenchStrategy
from polar_core.registry import Registry

__all__ = ["STRATEGIES", "StrategyFactory", "build_strategy"]

StrategyFactory = Callable[[Mapping[str, Any]], Strategy]
"""Builds a strategy from its options, validating them (raises :class:`~evaluator.errors.InvalidOptions`)."""


def _custom(options: Mapping[str, Any]) -> Strategy:
    """``strategy: custom`` with ``options.callable: "module:callable"``."""
    path = options.get("callable")
    if not isinstance(path, str):
        raise UnknownStrategy("strategy 'custom' needs options.callable ('module:callable')")
    return CustomStrategy(path, options)


STRATEGIES: Registry[StrategyFactory] = Registry(
    "evaluator strategy",
    [
        ("swe", SweStrategy),
        ("swebench", SwebenchStrategy),
        ("command", CommandStrategy),
        ("harbor", HarborStrategy),  # Harbor / Terminal-Bench task directories (polar_client.formats.harbor)
        ("session_completed", SessionCompletedStrategy),
        ("custom", _custom),
        # Names users were given for the same strategies (task.proto's EvaluatorSpec comment, docs/evaluator.md,
        # docs/gateway.md): registered like any other, so no separate alias table can drift from this one.
        ("swe_bench", SweStrategy),
        ("script", CommandStrategy),
        ("none", SessionCompletedStrategy),
    ],
    unknown=UnknownStrategy,
)
"""Strategy name → factory, in the order error messages list them."""


def build_strategy(spec: EvaluatorSpec) -> Strategy:
    """Build (and validate the options of) the strategy a spec names.

    ``strategy: custom`` with ``options.callable: "module:func"``, or ``strategy: "module:func"`` directly,
    selects a custom evaluator.

    Raises:
        UnknownStrategy: No such strategy (the message lists the registered names).
        InvalidOptions: Its options are malformed.
    """
    if spec.strategy not in STRATEGIES and ":" in spec.strategy:
        return CustomStrategy(spec.strategy, spec.options)
    return STRATEGIES.get_or_raise(spec.strategy)(spec.options)
