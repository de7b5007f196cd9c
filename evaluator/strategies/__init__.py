"""Evaluation strategies, one module each, registered by name in :data:`STRATEGIES` (``registry.py``).

``swe``, ``swebench``, ``harbor``, ``command``, ``session_completed``, ``custom`` and ``module:callable``.
"""

from __future__ import annotations

from evaluator.strategies.base import EvalContext, EvalTimeout, Strategy
from evaluator.strategies.command import CommandStrategy
from evaluator.strategies.custom import CustomEvaluation, CustomResult, CustomStrategy
from evaluator.strategies.harbor import HarborStrategy
from evaluator.strategies.registry import STRATEGIES, StrategyFactory, build_strategy
from evaluator.strategies.simple import SessionCompletedStrategy
from evaluator.strategies.swe import SweStrategy
from evaluator.strategies.swebench import SwebenchStrategy

__all__ = [
    "STRATEGIES",
    "CommandStrategy",
    "CustomEvaluation",
    "CustomResult",
    "CustomStrategy",
    "EvalContext",
    "EvalTimeout",
    "HarborStrategy",
    "SessionCompletedStrategy",
    "Strategy",
    "StrategyFactory",
    "SweStrategy",
    "SwebenchStrategy",
    "build_strategy",
]
