from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pytest

from evaluator import Artifacts, EvaluatorService, EvaluatorSettings, EvaluatorSpec, PrepareParams, evaluator_config
from evaluator.strategies.pytest_run import CONFIG_NAMES, choose_config, config_candidates, pytest_env
from polar_core.records import TerminalStatus, Trace

TESTS = ["pkg/tests/test_a.py", "other/test_b.py"]


def test_candidates_follow_pytests_order_from_the_first_test_file_up() -> None:
    got = config_candidates(TESTS)
    assert got[: len(CONFIG_NAMES)] == [f"pkg/tests/{n}" for n in CONFIG_NAMES]
    assert got.index("pkg/pytest.toml") < got.index("pytest.toml") < got.index("other/pytest.toml")
    assert len(got) == len(set(got))


@pytest.mark.parametrize(
    ("contents", "chosen"),
    [
        ({}, None),
        ({"pytest.ini": "", "pytest.toml": ""}, "pytest.toml"),  # pytest 9: pytest.toml first
        ({"pytest.ini": "[pytest]\n", ".pytest.toml": ""}, ".pytest.toml"),
        ({"pytest.ini": "", "pkg/setup.cfg": "[tool:pytest]\naddopts = -x\n"}, "pkg/setup.cfg"),  # nearer wins
        ({"pkg/setup.cfg": "[flake8]\n", "tox.ini": "[tox]\n", "setup.cfg": "[tool:pytest]\n"}, "setup.cfg"),
        ({"pyproject.toml": "[project]\nname = 'x'\n", "tox.ini": "[pytest]\n"}, "tox.ini"),
        ({"pyproject.toml": "[tool.pytest.ini_options]\n", "tox.ini": "[pytest]\n"}, "pyproject.toml"),
        ({"pyproject.toml": "[tool.pytest]\nminversion = '9'\n"}, "pyproject.toml"),
        ({"pkg/pyproject.toml": "[project]\nname = 'x'\n"}, "pkg/pyproject.toml"),  # the fallback, as in pytest
        ({"pyproject.toml": "not = [toml"}, "pyproject.toml"),  # pytest reports it
        ({"other/pytest.ini": ""}, "other/pytest.ini"),  # the second file's directories, after the first's
    ],
)
def test_choose_config(contents: dict[str, str], chosen: str | None) -> None:
    assert choose_config(TESTS, contents) == chosen


def test_environment_empties_pytest_variables() -> None:
    env = pytest_env(autoload=False)
    assert env["PYTEST_ADDOPTS"] == ""
    assert env["PYTEST_PLUGINS"] == ""
    assert env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] == "1"
    assert "PYTEST_DISABLE_PLUGIN_AUTOLOAD" not in pytest_env()


@pytest.fixture
def service(tmp_path: Path) -> EvaluatorService:
    return EvaluatorService(evaluator_config(EvaluatorSettings(state_dir=tmp_path, max_patch_bytes=10)))


@pytest.mark.parametrize("value", ["math.nan", "math.inf", "-math.inf", "CustomResult(0.5, trace_rewards=(math.nan,))",
                                   "CustomResult(1.0, call_rewards={'c1': math.inf})"])  # fmt: skip
async def test_custom_evaluator_non_finite_reward_is_refused(service, tmp_path, monkeypatch, value: str) -> None:
    name = f"nonfinite_{abs(hash(value))}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            f"""
            import math
            from evaluator import CustomResult

            def score(request):
                return {value}
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    trace = Trace("s", "t", 0, ["c1"], [1], [2], [1], [0.0])
    traces = (trace,) if "call_rewards" in value else ()
    handle = await service.prepare(PrepareParams(spec=EvaluatorSpec(f"{name}:score")))
    result = await service.evaluate(handle, Artifacts(traces=traces))
    assert result.status is TerminalStatus.INFRA_ERROR
    assert result.reward == 0.0
    assert all(math.isfinite(r) for r in result.trace_rewards)
    assert "non-finite reward" in result.error_message


async def test_patch_over_the_limit_is_invalid_patch(service) -> None:
    handle = await service.prepare(PrepareParams(spec=EvaluatorSpec("session_completed")))
    result = await service.evaluate(handle, Artifacts(patch=b"x" * 11))
    assert result.status is TerminalStatus.INVALID_PATCH
    assert "11 bytes" in result.error_message
    assert "10 bytes" in result.error_message
