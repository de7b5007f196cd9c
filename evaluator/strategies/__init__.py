"""Evaluation strategies: ``swe``, ``swebench``, ``harbor``, ``command``, ``session_completed``, ``module:callable``."""

from __future__ import annotations

from evaluator.errors import UnknownStrategy
from evaluator.models import EvaluatorSpec
from evaluator.strategies.base import EvalContext, EvalTimeout, Strategy
from evaluator.strategies.command import CommandStrategy
from evaluator.strategies.custom import CustomEvaluation, CustomResult, CustomStrategy
from evaluator.strategies.harbor import HarborStrategy
from evaluator.strategies.simple import SessionCompletedStrategy
from evaluator.strategies.swe import SweStrategy
from evaluator.strategies.swebench import SwebenchStrategy

__all__ = [
    "CommandStrategy",
    "CustomEvaluation",
    "CustomResult",
    "CustomStrategy",
    "EvalContext",
    "EvalTimeout",
    "HarborStrategy",
    "SessionCompletedStrategy",
    "Strategy",
    "SweStrategy",
    "SwebenchStrategy",
    "build_strategy",
]

# Aliases the prior art and the proto comments use for the same strategies.
_ALIASES = {"swe_bench": "swe", "script": "command", "none": "session_completed"}


def build_strategy(spec: EvaluatorSpec) -> Strategy:
    """Build (and validate the options of) the strategy a spec names.

    ``strategy: custom`` with ``options.callable: "module:func"``, or ``strategy: "module:func"`` directly,
    selects a custom evaluator.

    Raises:
        UnknownStrategy: No such strategy.
        InvalidOptions: Its options are malformed.
    """
    name = _ALIASES.get(spec.strategy, spec.strategy)
    if name == "swe":
        return SweStrategy(spec.options)
    if name == "swebench":
        return SwebenchStrategy(spec.options)
    if name == "command":
        return CommandStrategy(spec.options)
    if name == "harbor":  # Harbor / Terminal-Bench task directories (polar_client.formats.harbor)
        return HarborStrategy(spec.options)
    if name == "session_completed":
        return SessionCompletedStrategy(spec.options)
    if name == "custom":
        path = spec.options.get("callable")
        if not isinstance(path, str):
            raise UnknownStrategy("strategy 'custom' needs options.callable ('module:callable')")
        return CustomStrategy(path, spec.options)
    if ":" in name:
        return CustomStrategy(name, spec.options)
    raise UnknownStrategy(f"unknown evaluator strategy {spec.strategy!r}")
