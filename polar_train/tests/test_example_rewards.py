"""The example tasks' evaluator scripts: their rewards, and what they read."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "train"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / name / "reward.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lowercase_reward_is_the_share_of_a_to_z_in_48_character_slots() -> None:
    lowercase = _load("lowercase")
    assert lowercase.lowercase_prefix("") == 0.0
    assert lowercase.lowercase_prefix("a") == pytest.approx(1 / 48)  # stopping early never pays
    assert lowercase.lowercase_prefix("a" * 60) == 1.0
    assert lowercase.lowercase_prefix("aB c!" * 10) == pytest.approx(19 / 48)  # 9 x "aB c!", then "aB "


def test_lowercase_script_writes_reward_json(tmp_path: Path) -> None:
    (tmp_path / "artifacts").mkdir()
    (tmp_path / "artifacts" / "reply.txt").write_text("hello World")
    env = {"POLAR_ARTIFACTS_DIR": str(tmp_path / "artifacts"), "POLAR_REWARD_FILE": str(tmp_path / "eval" / "r.json")}
    subprocess.run([sys.executable, str(EXAMPLES / "lowercase" / "reward.py")], env=env, check=True)
    data = json.loads((tmp_path / "eval" / "r.json").read_text())
    assert data == {"reward": pytest.approx(9 / 48), "resolved": False}
    (tmp_path / "artifacts" / "reply.txt").unlink()  # no reply: reward 0
    subprocess.run([sys.executable, str(EXAMPLES / "lowercase" / "reward.py")], env=env, check=True)
    assert json.loads((tmp_path / "eval" / "r.json").read_text())["reward"] == 0.0


def test_sum_reward_grades_closeness_and_brevity(tmp_path: Path) -> None:
    total = _load("smollm2_sum")
    assert total.number_reward("12", 12) == 1.0
    assert total.number_reward(" 12. ", 12) == 1.0
    assert total.number_reward("The answer is 12.", 12) == 0.5
    assert total.number_reward("7 + 5 equals 12", 12) == 0.5  # the last integer is the answer
    assert total.number_reward("17", 12) == 0.5
    assert total.number_reward("no idea", 12) == 0.0
    sessions = tmp_path / ".pi-sessions" / "x"
    sessions.mkdir(parents=True)
    lines = [
        {"type": "session", "id": "s"},
        {"type": "message", "message": {"role": "user", "content": [{"type": "text", "text": "What is 3 + 4? Only"}]}},
        {"type": "message", "message": {"role": "assistant", "content": [{"type": "text", "text": "8"}]}},
        {"type": "message", "message": {"role": "assistant", "content": [{"type": "text", "text": "7"}]}},
    ]
    (sessions / "a.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\nnot json\n")
    assert total.transcript(tmp_path) == ("What is 3 + 4? Only", "7")
    assert total.score(tmp_path) == 1.0
    assert total.score(tmp_path / "nothing") == 0.0
