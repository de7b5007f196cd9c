"""Read JUnit XML reports (pytest's ``--junitxml``) and match them to pytest node ids."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping

from evaluator.models import TestOutcome, TestStatus

__all__ = ["node_id_key", "outcomes_for", "parse_junit"]

# When a test appears twice (a pass, then an error in teardown), the worse result wins.
_SEVERITY = {TestStatus.PASSED: 0, TestStatus.SKIPPED: 1, TestStatus.FAILED: 2, TestStatus.ERROR: 3}


def node_id_key(node_id: str) -> tuple[str, str]:
    """Map a pytest node id to the ``(classname, name)`` pytest writes to JUnit XML.

    ``tests/test_x.py::TestC::test_y[1]`` becomes ``("tests.test_x.TestC", "test_y[1]")``.
    """
    path, _, rest = node_id.partition("::")
    parts = rest.split("::") if rest else []
    module = path[:-3] if path.endswith(".py") else path
    module = module.replace("\\", "/").strip("/").replace("/", ".")
    name = parts[-1] if parts else ""
    classname = ".".join([module, *parts[:-1]])
    return classname, name


def parse_junit(xml_text: str | bytes) -> dict[tuple[str, str], tuple[TestStatus, float]]:
    """Return ``{(classname, name): (status, seconds)}`` for every ``testcase`` in a JUnit report.

    Raises:
        xml.etree.ElementTree.ParseError: The report is not XML.
    """
    root = ET.fromstring(xml_text)
    results: dict[tuple[str, str], tuple[TestStatus, float]] = {}
    for case in root.iter("testcase"):
        key = (case.get("classname", ""), case.get("name", ""))
        status = TestStatus.PASSED
        if case.find("error") is not None:
            status = TestStatus.ERROR
        elif case.find("failure") is not None:
            status = TestStatus.FAILED
        elif case.find("skipped") is not None:
            status = TestStatus.SKIPPED
        try:
            seconds = float(case.get("time", "0") or 0)
        except ValueError:
            seconds = 0.0
        previous = results.get(key)
        if previous is None or _SEVERITY[status] > _SEVERITY[previous[0]]:
            results[key] = (status, seconds + (previous[1] if previous else 0.0))
    return results


def outcomes_for(
    test_ids: Iterable[str], report: Mapping[tuple[str, str], tuple[TestStatus, float]]
) -> list[TestOutcome]:
    """The outcome of each expected test id; ids absent from the report are ``MISSING``."""
    outcomes = []
    for test_id in test_ids:
        found = report.get(node_id_key(test_id))
        if found is None:
            outcomes.append(TestOutcome(test_id, TestStatus.MISSING))
        else:
            outcomes.append(TestOutcome(test_id, found[0], found[1]))
    return outcomes
