"""The ``harbor`` strategy's pure parts: reading Harbor reward files and checking options."""

from __future__ import annotations

import pytest

from evaluator.errors import InvalidOptions
from evaluator.models import EvaluatorSpec
from evaluator.strategies import HarborStrategy, build_strategy
from evaluator.strategies.harbor import parse_reward


@pytest.mark.parametrize(
    ("raw", "json_file", "reward"),
    [
        (b"1\n", False, 1.0),
        (b" 0.25 ", False, 0.25),
        (b"0", False, 0.0),
        (b'{"reward": 0.5, "style": 1.0}', True, 0.5),
        (b'{"accuracy": 1.0}', True, 1.0),
        (b'{"a": 1.0, "b": 0.0}', True, 0.5),
        (b"0.75", True, 0.75),
    ],
)
def test_rewards_are_read_as_harbor_writes_them(raw: bytes, json_file: bool, reward: float) -> None:
    assert parse_reward(raw, json_file=json_file) == (reward, None)


@pytest.mark.parametrize(
    ("raw", "json_file", "why"),
    [
        (b"", False, "empty"),
        (b"nan", False, "non-finite"),
        (b"inf\n", False, "non-finite"),
        (b"passed", False, "not a number"),
        (b"\xff\xfe", False, "not text"),
        (b'{"reward": "1"}', True, "non-numeric"),
        (b'{"reward": true}', True, "non-numeric"),
        (b"{}", True, "empty"),
        (b"[1]", True, "not a number"),
        (b"NaN", True, "non-finite"),
        (b"{not json", True, "not a number"),
    ],
)
def test_garbage_rewards_are_refused_with_a_reason(raw: bytes, json_file: bool, why: str) -> None:
    reward, problem = parse_reward(raw, json_file=json_file)
    assert reward == 0.0
    assert problem is not None
    assert why in problem


def test_options_are_checked_when_the_strategy_is_built() -> None:
    spec = EvaluatorSpec(strategy="harbor", options={"repo": "/r", "tests_dir": "/t", "verifier_timeout_seconds": 5})
    strategy = build_strategy(spec)
    assert isinstance(strategy, HarborStrategy)
    assert strategy.verifier_timeout_s == 5.0
    with pytest.raises(InvalidOptions, match="tests_dir"):
        HarborStrategy({"repo": "/r"})
    with pytest.raises(InvalidOptions, match="LD_PRELOAD"):
        HarborStrategy({"repo": "/r", "tests_dir": "/t", "env": {"LD_PRELOAD": "/x.so"}})
