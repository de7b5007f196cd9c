"""Red team, evaluator half: a patch that tries to talk the evaluator into a verdict, one attack per vector.

Every attack is made against the unfixed ``paginate`` example, so the honest verdict is always ``unresolved``.
The runtimes put the repository on ``PYTHONPATH`` (as an editable install does in every SWE-bench image), which
makes each attack as strong as it can be; for the configuration, conftest and plugin attacks a plain pytest run
on the patched tree (``_naive_run``) shows the attack works when nothing stops it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path

import pytest

from evaluator import Artifacts, EvaluatorService, EvaluatorSettings, EvaluatorSpec, PrepareParams, evaluator_config
from evaluator.models import TestStatus
from integration_tests.support.evaluator import example_spec, make_patch
from polar_core.records import TerminalStatus
from runtimes import DefaultRuntimeFactory, Runtime, RuntimeSpec

# Marks every test passed: the cheat each configuration and plugin attack tries to get loaded.
FORCE_PASS = textwrap.dedent("""\
    import pytest


    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(item, call):
        outcome = yield
        report = outcome.get_result()
        report.outcome = "passed"
        report.longrepr = None
""")
PLUGIN = {"evil_plugin.py": FORCE_PASS}
TEST_FILE = "tests/test_pagination.py"


class EditableFactory(DefaultRuntimeFactory):
    """Runtimes whose ``PYTHONPATH`` holds the repository (plus any ``extra_env``, as an image could set)."""

    def __init__(self, base_dir: Path, extra_env: Mapping[str, str] | None = None) -> None:
        super().__init__(base_dir=base_dir)
        self.extra_env = dict(extra_env or {})

    def create(self, spec: RuntimeSpec, *, session_id: str) -> Runtime:
        repo = (self.base_dir / session_id).absolute() / "repo"
        env = {**spec.env, "PYTHONPATH": str(repo), **self.extra_env}
        return super().create(dataclasses.replace(spec, env=env), session_id=session_id)


def _service(tmp_path: Path, extra_env: Mapping[str, str] | None = None, **settings: object) -> EvaluatorService:
    config = evaluator_config(EvaluatorSettings(state_dir=tmp_path / "state", **settings))  # type: ignore[arg-type]
    return EvaluatorService(config, runtime_factory=EditableFactory(tmp_path / "rt", extra_env))


@pytest.fixture
async def service(tmp_path: Path):
    svc = _service(tmp_path)
    yield svc
    await svc.close()


@pytest.fixture
def paginate() -> tuple[EvaluatorSpec, Path]:
    spec, _ = example_spec("paginate")
    return spec, Path(spec.options["repo"])


@pytest.fixture
def bare(tmp_path: Path, paginate) -> tuple[EvaluatorSpec, Path]:
    """The paginate repository without any pytest configuration (it imports through ``PYTHONPATH``)."""
    spec, repo = paginate
    copy = tmp_path / "bare"
    shutil.copytree(repo, copy, ignore=shutil.ignore_patterns("__pycache__", "pytest.ini"))
    return dataclasses.replace(spec, options={**spec.options, "repo": str(copy)}), copy


async def _evaluate(svc: EvaluatorService, spec: EvaluatorSpec, patch: bytes | None):
    handle = await svc.prepare(PrepareParams(spec=spec, task_id="redteam"))
    return await svc.evaluate(handle, Artifacts(patch=patch))


def _naive_run(repo: Path, patch: bytes, tmp_path: Path) -> int:
    """Exit status of plain ``pytest`` on the patched tree, repository on ``PYTHONPATH``: 0 = the cheat worked."""
    work = tmp_path / "naive"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(repo, work, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    subprocess.run(["git", "apply", "-"], cwd=work, input=patch, check=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": str(work)}
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", TEST_FILE]
    return subprocess.run(argv, cwd=work, env=env, capture_output=True, timeout=120).returncode


def _log(result) -> str:
    return Path(result.log_ref).read_text()


def _has_pytest(python: str) -> bool:
    return subprocess.run([python, "-c", "import pytest"], capture_output=True).returncode == 0


def _assert_honest(result) -> None:
    assert result.status is TerminalStatus.UNRESOLVED, result.error_message
    assert result.reward == 0.0
    failing = {o.test_id.split("::")[1] for o in result.test_outcomes if o.status is not TestStatus.PASSED}
    assert {"test_partial_last_page", "test_single_partial_page"} <= failing


# -- Configuration files -----------------------------------------------------------------------------------

CONFIGS = {
    "pytest.toml": '[pytest]\naddopts = ["-p", "evil_plugin"]\n',
    ".pytest.toml": '[pytest]\naddopts = ["-p", "evil_plugin"]\n',
    "pytest.ini": "[pytest]\naddopts = -p evil_plugin\n",
    ".pytest.ini": "[pytest]\naddopts = -p evil_plugin\n",
    "pyproject.toml": '[tool.pytest.ini_options]\naddopts = "-p evil_plugin"\n',
    "tox.ini": "[pytest]\naddopts = -p evil_plugin\n",
    "setup.cfg": "[tool:pytest]\naddopts = -p evil_plugin\n",
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
async def test_config_file_added_by_the_patch_is_ignored(service, bare, tmp_path: Path, name: str) -> None:
    spec, repo = bare
    patch = make_patch(repo, {name: CONFIGS[name], **PLUGIN})
    assert _naive_run(repo, patch, tmp_path) == 0
    result = await _evaluate(service, spec, patch)
    _assert_honest(result)
    log = _log(result)
    assert name in log.split("restored the task's own test files", 1)[1]
    assert "evaluator-written, empty" in log


async def test_pytest_toml_does_not_override_the_repositorys_pytest_ini(service, paginate, tmp_path: Path) -> None:
    # pytest 9 reads pytest.toml before pytest.ini in the same directory.
    spec, repo = paginate
    patch = make_patch(repo, {"pytest.toml": CONFIGS["pytest.toml"], **PLUGIN})
    assert _naive_run(repo, patch, tmp_path) == 0
    result = await _evaluate(service, spec, patch)
    _assert_honest(result)
    assert re.search(r"^config: \S+/repo/pytest\.ini$", _log(result), re.M)


async def test_config_deselecting_the_failing_tests_is_ignored(service, paginate, tmp_path: Path) -> None:
    spec, repo = paginate
    ini = "[pytest]\npythonpath = .\naddopts = -k 'not partial'\n"
    patch = make_patch(repo, {"pytest.ini": ini, "pkg/setup.cfg": "[tool:pytest]\naddopts = -x\n"})
    result = await _evaluate(service, spec, patch)
    _assert_honest(result)
    assert all(o.status is not TestStatus.MISSING for o in result.test_outcomes)


# -- conftest.py and plugins ---------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["conftest.py", "tests/conftest.py"])
async def test_conftest_forcing_passes_is_removed(service, paginate, tmp_path: Path, where: str) -> None:
    spec, repo = paginate
    patch = make_patch(repo, {where: FORCE_PASS})
    assert _naive_run(repo, patch, tmp_path) == 0
    result = await _evaluate(service, spec, patch)
    _assert_honest(result)
    assert where in _log(result)


async def test_entry_point_plugin_added_by_the_patch_is_not_loaded(service, paginate, tmp_path: Path) -> None:
    spec, repo = paginate
    dist = "evil-1.0.dist-info"
    patch = make_patch(
        repo,
        {
            f"{dist}/METADATA": "Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n",
            f"{dist}/entry_points.txt": "[pytest11]\nevil = evil_plugin\n",
            **PLUGIN,
        },
    )
    assert _naive_run(repo, patch, tmp_path) == 0
    result = await _evaluate(service, spec, patch)
    _assert_honest(result)
    log = _log(result)
    assert f"{dist}/entry_points.txt" in log
    # Neither in the evaluator's list nor in the header where pytest names the plugins it loaded.
    plugins = re.findall(r"^plugins: (.*)$", log, re.M)
    assert len(plugins) == 2
    assert not any("evil" in line or "autoload" in line for line in plugins)


async def test_pytest_plugins_and_addopts_in_the_environment_are_emptied(paginate, tmp_path: Path) -> None:
    # As if the image (or anything but the evaluator) set them: the test run gets them empty.
    spec, repo = paginate
    env = {"PYTEST_PLUGINS": "evil_plugin", "PYTEST_ADDOPTS": "-p evil_plugin"}
    svc = _service(tmp_path, extra_env=env)
    try:
        # The plugin module is an ordinary source file a patch may add; only loading it would cheat.
        result = await _evaluate(svc, spec, make_patch(repo, PLUGIN))
    finally:
        await svc.close()
    _assert_honest(result)


# -- The report ----------------------------------------------------------------------------------------------

FORGED = (
    '<testsuites><testsuite name="pytest">'
    + "".join(f'<testcase classname="tests.test_pagination" name="{n}"/>'
              for n in ("test_partial_last_page", "test_single_partial_page", "test_exact_multiple",
                        "test_empty", "test_page_items", "test_bad_per_page"))
    + "</testsuite></testsuites>"
)  # fmt: skip


@pytest.mark.parametrize(
    "payload",
    [
        "import os\nos._exit(0)\n",
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
        # Forge a passing report where the evaluator used to read it, then leave before pytest writes one.
        "import os, pathlib\n"
        "for d in (pathlib.Path.cwd().parent / 'eval', pathlib.Path.cwd()):\n"
        "    (d / 'junit.xml').write_text(" + repr(FORGED) + ")\n"
        "os._exit(0)\n",
    ],
    ids=["os_exit_0", "sigkill_self", "forged_report_then_exit"],
)
async def test_patch_that_kills_pytest_at_import_is_unresolved(service, paginate, payload: str) -> None:
    spec, repo = paginate
    source = (repo / "pagination.py").read_text()
    patch = make_patch(repo, {"pagination.py": payload + source})
    result = await _evaluate(service, spec, patch)
    assert result.status is TerminalStatus.UNRESOLVED, result.error_message
    assert result.reward == 0.0
    assert "wrote no JUnit report" in result.error_message
    assert {o.status for o in result.test_outcomes} == {TestStatus.MISSING}


async def test_python_without_pytest_is_still_infra_error(service, paginate) -> None:
    # No report because the environment is broken, not the patch: not the model's failure.
    if _has_pytest("/usr/bin/python3"):
        pytest.skip("/usr/bin/python3 has pytest here")
    spec, _ = paginate
    spec = dataclasses.replace(spec, options={**spec.options, "python": "/usr/bin/python3"})
    result = await _evaluate(service, spec, None)
    assert result.status is TerminalStatus.INFRA_ERROR
    assert "cannot import pytest" in result.error_message


# -- Rewards and patch size ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reward_json",
    ['{"reward": NaN}', '{"reward": Infinity}', '{"reward": -Infinity}', '{"reward": 1.0, "trace_rewards": [NaN]}',
     '{"reward": "nan"}'],
)  # fmt: skip
async def test_non_finite_reward_json_is_refused(service, reward_json: str) -> None:
    spec = EvaluatorSpec("command", {"command": f"echo '{reward_json}' > \"$POLAR_REWARD_FILE\""})
    result = await _evaluate(service, spec, None)
    assert result.status is TerminalStatus.INFRA_ERROR
    assert not result.status.trainable
    assert result.reward == 0.0
    assert "non-finite reward" in result.error_message
    assert json.loads(json.dumps(result.to_dict()))["reward"] == 0.0


async def test_oversize_patch_is_invalid_patch(tmp_path: Path, paginate) -> None:
    spec, repo = paginate
    svc = _service(tmp_path, max_patch_bytes=4096)
    try:
        patch = make_patch(repo, {"big.txt": "x" * 8192 + "\n"})
        result = await _evaluate(svc, spec, patch)
        assert result.status is TerminalStatus.INVALID_PATCH
        assert str(len(patch)) in result.error_message
        assert "4096" in result.error_message
        small = await _evaluate(svc, spec, make_patch(repo, {"note.txt": "hi\n"}))
        assert small.status is TerminalStatus.UNRESOLVED
    finally:
        await svc.close()
    assert EvaluatorSettings(state_dir=tmp_path).max_patch_bytes == 64 * 1024 * 1024
