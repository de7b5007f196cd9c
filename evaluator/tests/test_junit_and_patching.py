from __future__ import annotations

import pytest

from evaluator.junit import node_id_key, outcomes_for, parse_junit
from evaluator.models import TestStatus
from evaluator.strategies.patching import DEFAULT_PROTECTED, is_protected

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="5">
<testcase classname="tests.test_a" name="test_ok" time="0.010"/>
<testcase classname="tests.test_a" name="test_bad" time="0.020"><failure message="x">boom</failure></testcase>
<testcase classname="tests.test_a.TestK" name="test_p[1]" time="0.001"><skipped message="s"/></testcase>
<testcase classname="tests.test_a" name="test_teardown" time="0.1"/>
<testcase classname="tests.test_a" name="test_teardown" time="0.1"><error message="teardown"/></testcase>
</testsuite></testsuites>"""


@pytest.mark.parametrize(
    ("node_id", "key"),
    [
        ("tests/test_a.py::test_ok", ("tests.test_a", "test_ok")),
        ("tests/test_a.py::TestK::test_p[1]", ("tests.test_a.TestK", "test_p[1]")),
        ("test_top.py::test_x", ("test_top", "test_x")),
    ],
)
def test_node_id_key(node_id: str, key: tuple[str, str]) -> None:
    assert node_id_key(node_id) == key


def test_outcomes_cover_every_status() -> None:
    report = parse_junit(REPORT)
    ids = [
        "tests/test_a.py::test_ok",
        "tests/test_a.py::test_bad",
        "tests/test_a.py::TestK::test_p[1]",
        "tests/test_a.py::test_teardown",
        "tests/test_a.py::test_absent",
    ]
    got = {o.test_id.split("::")[-1]: o.status for o in outcomes_for(ids, report)}
    assert got == {
        "test_ok": TestStatus.PASSED,
        "test_bad": TestStatus.FAILED,
        "test_p[1]": TestStatus.SKIPPED,
        "test_teardown": TestStatus.ERROR,  # the worse of the two entries wins
        "test_absent": TestStatus.MISSING,
    }


@pytest.mark.parametrize(
    ("path", "protected"),
    [
        ("tests/test_x.py", True),
        ("pkg/tests/helpers.py", True),
        ("conftest.py", True),
        ("src/conftest.py", True),
        ("pytest.ini", True),
        ("test_top.py", True),
        ("pytest.toml", True),
        (".pytest.toml", True),
        ("sub/dir/.pytest.ini", True),
        ("pkg/pyproject.toml", True),
        ("setup.cfg", True),
        ("a/tox.ini", True),
        ("sitecustomize.py", True),
        ("evil-1.0.dist-info/entry_points.txt", True),
        ("src/evil.egg-info/entry_points.txt", True),
        ("pkg/module.py", False),
        ("pkg/setup.py", False),
        ("contest.py", False),
        ("latest.py", False),
    ],
)
def test_protected_paths(path: str, protected: bool) -> None:
    assert is_protected(path, DEFAULT_PROTECTED) is protected
