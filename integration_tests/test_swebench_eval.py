"""SWE-bench instances graded by the official ``swebench`` package, end to end through the evaluator service.

The instance is a real one of a small real library (``toml``, see :mod:`integration_tests.support.swebench`):
in the local (bubblewrap) runtime from a host repository, and in the Docker runtime from an image whose
``/testbed`` holds the repository (built here on the offline Python image, as no image can be pulled).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from evaluator import Artifacts, EvaluatorService, EvaluatorSettings, EvaluatorSpec, PrepareParams, evaluator_config
from evaluator.errors import InvalidOptions
from evaluator.models import EvaluationResult, TestStatus
from evaluator.strategies import build_strategy
from integration_tests.support.docker import private_docker
from integration_tests.support.evaluator import make_patch
from integration_tests.support.swebench import build_image, make_instance
from polar_client.formats.swebench import record_to_mapping
from polar_core.records import TerminalStatus
from runtimes import DefaultRuntimeFactory

F2P = "tests/test_bool.py::test_dumps_bool"
P2P = {"tests/test_basic.py::test_loads_table", "tests/test_basic.py::test_dumps_int"}
_ENCODER = "src/toml/encoder.py"
# The agent's code prints the result line the pytest log parser reads, after pytest's own summary (an atexit
# hook runs once capture has ended), and exits 0 so the recorded exit status agrees: the official parser keeps
# the last line it reads for a test, so on its own it would grade this unfixed tree as resolved.
_FORGE = (
    "import atexit as _atexit, os as _os, sys as _sys\n"
    f"_atexit.register(lambda: (_sys.stdout.write('PASSED {F2P}\\n'), _sys.stdout.flush(), _os._exit(0)))\n"
)

_EXIT_EARLY = (
    "import os as _os\n"
    "_lines = ''.join(f'PASSED {t}\\n' for t in " + repr(sorted({F2P, *P2P})) + ").encode()\n"
    "for _fd in range(1, 64):\n"
    "    try:\n"
    "        _os.write(_fd, _lines)\n"
    "    except OSError:\n"
    "        pass\n"
    "_os._exit(0)\n"
)


@pytest.fixture(scope="module")
def instance(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    return make_instance(tmp_path_factory.mktemp("swebench"), sys.executable)


def _options(record: dict[str, Any], **extra: Any) -> dict[str, Any]:
    evaluator = dict(record_to_mapping(record)["evaluator"])
    evaluator.pop("strategy")
    return {**evaluator, **extra}


@pytest.fixture
async def local(tmp_path: Path, instance: tuple[Path, dict[str, Any]]) -> AsyncIterator[EvaluatorService]:
    settings = EvaluatorSettings(state_dir=tmp_path / "state", task_roots=[str(instance[0].parent)])
    svc = EvaluatorService(evaluator_config(settings), runtime_factory=DefaultRuntimeFactory(base_dir=tmp_path / "rt"))
    yield svc
    await svc.close()


async def _grade(svc: EvaluatorService, options: dict[str, Any], patch: bytes, image: str = "") -> EvaluationResult:
    handle = await svc.prepare(PrepareParams(spec=EvaluatorSpec("swebench", options), image=image, session_id="s"))
    return await svc.evaluate(handle, Artifacts(patch=patch))


def _statuses(result: EvaluationResult) -> dict[str, TestStatus]:
    return {o.test_id: o.status for o in result.test_outcomes}


def _encoder(repo: Path, old: str, new: str) -> dict[str, str]:
    source = (repo / _ENCODER).read_text(encoding="utf-8")
    assert old in source
    return {_ENCODER: source.replace(old, new)}


@pytest.mark.slow
async def test_reference_empty_breaking_and_garbage_patches(local: EvaluatorService, instance: Any) -> None:
    repo, record = instance
    options = _options(record, repo=str(repo))
    result = await _grade(local, options, record["patch"].encode())
    assert result.status is TerminalStatus.RESOLVED, result.error_message
    assert result.reward == 1.0
    assert _statuses(result) == {F2P: TestStatus.PASSED, **dict.fromkeys(P2P, TestStatus.PASSED)}

    result = await _grade(local, options, b"")
    assert result.status is TerminalStatus.UNRESOLVED
    assert result.reward == 0.0
    assert _statuses(result) == {F2P: TestStatus.FAILED, **dict.fromkeys(P2P, TestStatus.PASSED)}

    # Fixes the F2P test but breaks dumping integers, which a PASS_TO_PASS test checks.
    fixed = _encoder(repo, "bool: lambda v: unicode(v),", "bool: lambda v: unicode(v).lower(),")[_ENCODER]
    breaking = make_patch(repo, {_ENCODER: fixed.replace("int: lambda v: v,", "int: lambda v: v + 1,")})
    result = await _grade(local, options, breaking)
    assert result.status is TerminalStatus.UNRESOLVED
    assert _statuses(result)[F2P] is TestStatus.PASSED
    assert _statuses(result)["tests/test_basic.py::test_dumps_int"] is TestStatus.FAILED

    result = await _grade(local, options, b"--- a/x\n+++ b/x\n@@ garbage\n")
    assert result.status is TerminalStatus.INVALID_PATCH


@pytest.mark.slow
async def test_forged_result_lines_and_planted_tests_are_unresolved(
    local: EvaluatorService, instance: Any, tmp_path: Path
) -> None:
    repo, record = instance
    options = _options(record, repo=str(repo))
    init = (repo / "src/toml/__init__.py").read_text(encoding="utf-8")
    forged = make_patch(repo, {"src/toml/__init__.py": _FORGE + init})
    result = await _grade(local, options, forged)
    assert result.status is TerminalStatus.UNRESOLVED, result.error_message
    assert "reports tests twice with different results" in result.error_message
    assert F2P in result.error_message

    # The guard is what stops it: the official report alone, on the same log, is fooled.
    from swebench.harness.grading import get_eval_report

    (log,) = (tmp_path / "state").rglob("test_output.txt")
    spec = build_strategy(EvaluatorSpec("swebench", options)).spec  # type: ignore[attr-defined]
    report = get_eval_report(spec, {"instance_id": record["instance_id"], "model_patch": "x"}, str(log), True)
    assert report[record["instance_id"]]["resolved"] is True

    # Result lines for every test written to every open descriptor (past pytest's capture) at import, then
    # exit 0 before pytest reports anything: no conflicting line, an exit status of 0, and the official
    # report alone believes it; pytest's own JUnit report never appears, so it is not believed.
    early_exit = make_patch(repo, {"src/toml/__init__.py": _EXIT_EARLY + init})
    result = await _grade(local, options, early_exit)
    assert result.status is TerminalStatus.UNRESOLVED, result.error_message
    assert "pytest wrote no (readable) JUnit report" in result.error_message
    logs = sorted((tmp_path / "state").rglob("test_output.txt"), key=lambda p: p.stat().st_mtime)
    report = get_eval_report(spec, {"instance_id": record["instance_id"], "model_patch": "x"}, str(logs[-1]), True)
    assert report[record["instance_id"]]["resolved"] is True

    # A test file the eval applies, written by the agent to pass, and a conftest forcing passes: both undone.
    planted = {
        "tests/test_bool.py": "def test_dumps_bool():\n    pass\n",
        "conftest.py": (
            "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
            "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
        ),
    }
    result = await _grade(local, options, make_patch(repo, planted))
    assert result.status is TerminalStatus.UNRESOLVED, result.error_message
    assert _statuses(result)[F2P] is TestStatus.FAILED


def test_unknown_parser_and_missing_fields_are_invalid_options(instance: Any) -> None:
    _, record = instance
    with pytest.raises(InvalidOptions, match="log_parser 'parse_log_nonesuch'") as info:
        build_strategy(
            EvaluatorSpec(
                "swebench",
                _options({**record}, instance={**_options(record)["instance"], "log_parser": "parse_log_nonesuch"}),
            )
        )
    assert info.value.details["field"] == "log_parser"
    bad = dict(_options(record)["instance"])
    del bad["eval_script"]
    with pytest.raises(InvalidOptions, match="lacks eval_script"):
        build_strategy(EvaluatorSpec("swebench", {"instance": bad}))
    with pytest.raises(InvalidOptions, match=r"options\.instance"):
        build_strategy(EvaluatorSpec("swebench", {}))


@dataclasses.dataclass(frozen=True)
class DockerEnv:
    """A private daemon's client and two instance images: plain, and with the repository installed editable."""

    client: Any
    image: str
    record: dict[str, Any]
    editable_image: str
    editable_record: dict[str, Any]


@pytest.fixture(scope="module")
def docker_env(instance: tuple[Path, dict[str, Any]]) -> Iterator[DockerEnv]:
    repo, record = make_instance(instance[0].parent / "image")  # the image's own python3 runs the tests
    editable_repo, editable_record = make_instance(instance[0].parent / "editable", editable=True)
    with private_docker() as (_, client, base):
        image = build_image(client, base, repo)
        yield DockerEnv(client, image, record, build_image(client, base, editable_repo, editable=True), editable_record)


def _docker_service(tmp_path: Path, env: DockerEnv, image: str) -> EvaluatorService:
    factory = DefaultRuntimeFactory(base_dir=tmp_path / "rt", docker_client=env.client)
    settings = EvaluatorSettings(state_dir=tmp_path / "state", allowed_images=[image])
    return EvaluatorService(evaluator_config(settings), runtime_factory=factory)


@pytest.mark.slow
@pytest.mark.parametrize("editable", [False, True], ids=["plain", "editable-install"])
async def test_in_the_instance_image(tmp_path: Path, docker_env: DockerEnv, editable: bool) -> None:
    """Graded in a clean container of the instance's image. ``editable-install``, as in the official images: the
    repository is ``pip install -e``-ed at ``/testbed`` (``src/`` layout) and the eval script runs a venv's
    ``python -m pytest``, so the grading copy is what the tests import only through the mapped editable paths
    (without them the gold patch is graded on the image's unpatched code: ``unresolved``)."""
    image = docker_env.editable_image if editable else docker_env.image
    record = docker_env.editable_record if editable else docker_env.record
    svc = _docker_service(tmp_path, docker_env, image)
    try:
        options = _options(record)
        result = await _grade(svc, options, record["patch"].encode(), image)
        assert result.status is TerminalStatus.RESOLVED, result.error_message
        assert _statuses(result)[F2P] is TestStatus.PASSED
        result = await _grade(svc, options, b"", image)
        assert result.status is TerminalStatus.UNRESOLVED
        assert _statuses(result)[F2P] is TestStatus.FAILED
        result = await _grade(svc, options, b"not a patch\n", image)
        assert result.status is TerminalStatus.INVALID_PATCH
    finally:
        await svc.close()
