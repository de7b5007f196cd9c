"""The ``swebench`` strategy's pure parts: option checks and the forged-result-line guard (no runtime)."""

from __future__ import annotations

from typing import Any

import pytest

from evaluator.errors import InvalidOptions
from evaluator.models import EvaluatorSpec
from evaluator.strategies import SwebenchStrategy, build_strategy
from evaluator.strategies.swebench import conflicting_results

_INSTANCE = {
    "instance_id": "octo__lib-7", "repo": "octo/lib", "version": "1.0", "base_commit": "0" * 40,
    "test_patch": "diff --git a/tests/test_a.py b/tests/test_a.py\n",
    "FAIL_TO_PASS": ["tests/test_a.py::test_new"], "PASS_TO_PASS": ["tests/test_a.py::test_old"],
    "log_parser": "parse_log_pytest", "eval_type": "pass_and_fail",
    "eval_script": ": '>>>>> Start Test Output'\npytest -rA tests/test_a.py\n: '>>>>> End Test Output'\n",
}  # fmt: skip


def _strategy(**changes: Any) -> SwebenchStrategy:
    strategy = build_strategy(EvaluatorSpec("swebench", {"instance": {**_INSTANCE, **changes}}))
    assert isinstance(strategy, SwebenchStrategy)
    return strategy


def test_the_official_test_spec_and_protected_files() -> None:
    strategy = _strategy()
    assert strategy.spec.FAIL_TO_PASS == ["tests/test_a.py::test_new"]
    assert "SWEBENCH_TEST_EXIT_CODE=$?" in strategy.spec.eval_script  # swebench's own exit-status line
    assert "tests/test_a.py" in strategy.protected
    assert "conftest.py" in strategy.protected
    assert strategy.junit_check  # a pytest parser


def test_conflicting_lines_of_listed_tests_only() -> None:
    spec = _strategy().spec
    honest = "PASSED tests/test_a.py::test_old\nFAILED tests/test_a.py::test_new - AssertionError\n"
    assert conflicting_results(honest, spec) == {}
    forged = honest + "PASSED tests/test_a.py::test_new\n"
    assert conflicting_results(forged, spec) == {"tests/test_a.py::test_new": {"PASSED", "FAILED"}}
    teardown = honest + "PASSED tests/test_a.py::test_other\nERROR tests/test_a.py::test_other - teardown\n"
    assert conflicting_results(teardown, spec) == {}  # not listed: not the verdict's business


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"instance": {**_INSTANCE, "log_parser": "parse_log_nonesuch"}}, "log_parser"),
        ({"instance": {**_INSTANCE, "eval_type": "sometimes"}}, "eval_type"),
        ({"instance": {**_INSTANCE, "PASS_TO_PASS": "tests/test_a.py::test_old"}}, "PASS_TO_PASS"),
        ({"instance": {k: v for k, v in _INSTANCE.items() if k != "version"}}, "version"),
        ({"instance": _INSTANCE, "junit_check": "yes"}, "junit_check"),
    ],
)
def test_bad_options_name_the_field(options: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidOptions) as info:
        build_strategy(EvaluatorSpec("swebench", options))
    assert info.value.details["field"] == field
