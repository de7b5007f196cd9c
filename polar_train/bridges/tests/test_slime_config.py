"""The slime bridge's configuration: read from slime's args and the environment, refused before any submission."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from polar_train.bridges import slime
from polar_train.bridges.slime_settings import BridgeConfigError, bridge_config
from polar_train.bridges.slime_window import instruction_of


def _args(tmp_path: Path, **overrides: Any) -> argparse.Namespace:
    values: dict[str, Any] = {
        "rollout_batch_size": 4,
        "n_samples_per_prompt": 16,
        "save": str(tmp_path / "ckpt"),
        "polar_task": str(tmp_path / "task.yaml"),
        "polar_max_async_level": 2,
        "polar_max_policy_lag": 2,
        # Nothing listens here: a configuration error must be raised before any connection is tried.
        "polar_server": "127.0.0.1:1",
    }
    values.update(overrides)
    return argparse.Namespace(**values)


def test_settings_come_from_args_then_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLAR_SLIME_TOKEN", "from-env")
    monkeypatch.setenv("POLAR_SLIME_MAX_ASYNC_LEVEL", "5")
    cfg = bridge_config(_args(tmp_path, polar_max_policy_lag=6))
    assert cfg.settings.token == "from-env"
    assert cfg.settings.max_async_level == 2  # args (slime's --custom-config-path) win over the environment
    assert cfg.window == 8
    assert cfg.journal == tmp_path / "ckpt" / "polar_slime_journal.jsonl"
    assert cfg.settings.multi_trace == "longest"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"n_samples_per_prompt": 0}, "a task without samples"),
        ({"n_samples_per_prompt": 1}, "a group of one"),
        ({"rollout_batch_size": 0}, "rollout_batch_size"),
        ({"polar_max_async_level": 0, "polar_max_policy_lag": 0}, "polar_max_async_level must be at least 1"),
        ({"polar_max_async_level": 3, "polar_max_policy_lag": 2}, "cannot be honoured"),
        ({"polar_max_policy_lag": -1}, "cannot be honoured"),
        ({"polar_task": None}, "set polar_task"),
        ({"save": None}, "set polar_journal"),
        ({"polar_multi_trace": "split"}, "multi_trace"),
        ({"polar_stale_policy": "drop"}, "stale_policy"),
        ({"n_samples_per_prompt": "16"}, "must be an integer"),
    ],
)
def test_bad_configurations_are_refused_before_any_submission(
    tmp_path: Path, overrides: dict[str, Any], message: str
) -> None:
    args = _args(tmp_path, **overrides)
    with pytest.raises(BridgeConfigError, match=message):
        bridge_config(args)
    with pytest.raises(BridgeConfigError, match=message):
        slime.generate_rollout(args, 0, data_source=None)
    assert not (tmp_path / "ckpt").exists()  # not even the journal was created


def test_a_template_asking_for_another_group_size_is_refused(tmp_path: Path) -> None:
    (tmp_path / "task.yaml").write_text("instruction: x\nnum_samples: 8\nharness: {name: command}\n")
    with pytest.raises(BridgeConfigError, match="num_samples 8"):
        slime.generate_rollout(_args(tmp_path), 0, data_source=None)
    assert slime.running_bridge(tmp_path / "ckpt" / "polar_slime_journal.jsonl") is None


def test_evaluation_keeps_slimes_own_rollout_function(tmp_path: Path) -> None:
    with pytest.raises(BridgeConfigError, match="eval-function-path"):
        slime.generate_rollout(_args(tmp_path), 0, data_source=None, evaluation=True)


def test_the_instruction_is_the_prompt_or_its_last_user_message() -> None:
    assert instruction_of("Fix the bug.") == "Fix the bug."
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    assert instruction_of(chat) == "b"
    with pytest.raises(BridgeConfigError):
        instruction_of([{"role": "system", "content": "s"}])
    with pytest.raises(BridgeConfigError):
        instruction_of("  ")
