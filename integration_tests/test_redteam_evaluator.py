"""Red team, evaluator half: a patch that tries to talk the evaluator into a verdict, one attack per vector.

Every attack is made against the unfixed ``paginate`` example, so the honest verdict is always ``unresolved``
(or the status that names the failure: ``invalid_patch``, ``infra_error`` for a non-finite reward). The
runtimes put the repository on ``PYTHONPATH`` (as an editable install does in every SWE-bench image), which
makes each attack as strong as it can be; for the configuration, conftest and plugin attacks a plain pytest run
on the patched tree (``_naive_run``) shows the attack works when nothing stops it.

Each attack in :data:`ATTACKS` runs twice: with the evaluator (and so its local runtime) in this process,
usually root, and in a driver process started as an unprivileged host user (``polar-redteam``, as in
``test_redteam_sandbox.py``) with the system Python; both must give the same honest verdict. The Docker runtime
runs the shipped examples in ``test_evaluator_docker.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from evaluator import EvaluatorSettings, EvaluatorSpec
from evaluator.models import EvaluationResult, TestStatus
from integration_tests.support.evaluator import (
    EXAMPLE_TASKS_DIR,
    editable_service,
    evaluate_once,
    example_spec,
    make_patch,
    run_case,
)
from integration_tests.support.unprivileged import run_module_as, unprivileged_dir
from polar_core.records import TerminalStatus

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

# As in the sandbox red team: an unprivileged host user (created when missing) and a directory it owns; skipped,
# with the reason, where there is none.


@pytest.fixture
def user_dir() -> Iterator[tuple[str, Path]]:
    with unprivileged_dir() as found:
        yield found


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


def _log(result: EvaluationResult) -> str:
    return Path(result.log_ref).read_text()


def _owner(path: str) -> int:
    return Path(path).stat().st_uid


def _has_pytest(python: str) -> bool:
    return subprocess.run([python, "-c", "import pytest"], capture_output=True).returncode == 0


def _assert_honest(result: EvaluationResult) -> None:
    assert result.status is TerminalStatus.UNRESOLVED, result.error_message
    assert result.reward == 0.0
    failing = {o.test_id.split("::")[1] for o in result.test_outcomes if o.status is not TestStatus.PASSED}
    assert {"test_partial_last_page", "test_single_partial_page"} <= failing


# -- The attacks ---------------------------------------------------------------------------------------------

Check = Callable[[EvaluationResult, bytes | None], None]


@dataclasses.dataclass(frozen=True)
class Attack:
    """One attack and the honest verdict on it.

    Attributes:
        changes: The files the patch writes, given the repository; ``None``: no patch.
        check: Asserts the honest verdict, given the result and the patch.
        base: ``paginate``, ``bare`` (paginate without its ``pytest.ini``) or ``command`` (no repository).
        naive: Plain pytest on the patched tree passes, i.e. the attack works when nothing stops it.
        command: The ``command`` strategy's command (``base="command"``).
        settings: Evaluator settings of the service.
        extra_env: Environment the runtime gives every command, as an image could set it.
    """

    changes: Callable[[Path], Mapping[str, str]] | None
    check: Check
    base: str = "paginate"
    naive: bool = False
    command: str = ""
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    extra_env: Mapping[str, str] = dataclasses.field(default_factory=dict)


def _honest(result: EvaluationResult, patch: bytes | None) -> None:
    _assert_honest(result)


# Configuration files: one that loads the cheating plugin, in a repository without a configuration of its own.
CONFIGS = {
    "pytest.toml": '[pytest]\naddopts = ["-p", "evil_plugin"]\n',
    ".pytest.toml": '[pytest]\naddopts = ["-p", "evil_plugin"]\n',
    "pytest.ini": "[pytest]\naddopts = -p evil_plugin\n",
    ".pytest.ini": "[pytest]\naddopts = -p evil_plugin\n",
    "pyproject.toml": '[tool.pytest.ini_options]\naddopts = "-p evil_plugin"\n',
    "tox.ini": "[pytest]\naddopts = -p evil_plugin\n",
    "setup.cfg": "[tool:pytest]\naddopts = -p evil_plugin\n",
}


def _config_ignored(name: str) -> Check:
    def check(result: EvaluationResult, patch: bytes | None) -> None:
        _assert_honest(result)
        log = _log(result)
        assert name in log.split("restored the task's own test files", 1)[1]
        assert "evaluator-written, empty" in log

    return check


def _repo_config_kept(result: EvaluationResult, patch: bytes | None) -> None:
    # pytest 9 reads pytest.toml before pytest.ini in the same directory.
    _assert_honest(result)
    assert re.search(r"^config: \S+/repo/pytest\.ini$", _log(result), re.M)


DESELECT = {
    "pytest.ini": "[pytest]\npythonpath = .\naddopts = -k 'not partial'\n",
    "pkg/setup.cfg": "[tool:pytest]\naddopts = -x\n",
}


def _nothing_deselected(result: EvaluationResult, patch: bytes | None) -> None:
    _assert_honest(result)
    assert all(o.status is not TestStatus.MISSING for o in result.test_outcomes)


def _conftest_removed(where: str) -> Check:
    def check(result: EvaluationResult, patch: bytes | None) -> None:
        _assert_honest(result)
        assert where in _log(result)

    return check


_DIST = "evil-1.0.dist-info"
ENTRY_POINT = {
    f"{_DIST}/METADATA": "Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n",
    f"{_DIST}/entry_points.txt": "[pytest11]\nevil = evil_plugin\n",
    **PLUGIN,
}


def _entry_point_not_loaded(result: EvaluationResult, patch: bytes | None) -> None:
    _assert_honest(result)
    log = _log(result)
    assert f"{_DIST}/entry_points.txt" in log
    # Neither in the evaluator's list nor in the header where pytest names the plugins it loaded.
    plugins = re.findall(r"^plugins: (.*)$", log, re.M)
    assert len(plugins) == 2
    assert not any("evil" in line or "autoload" in line for line in plugins)


FORGED = (
    '<testsuites><testsuite name="pytest">'
    + "".join(f'<testcase classname="tests.test_pagination" name="{n}"/>'
              for n in ("test_partial_last_page", "test_single_partial_page", "test_exact_multiple",
                        "test_empty", "test_page_items", "test_bad_per_page"))
    + "</testsuite></testsuites>"
)  # fmt: skip

KILLERS = {
    "os_exit_0": "import os\nos._exit(0)\n",
    "sigkill_self": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n",
    # Forge a passing report where the evaluator used to read it, then leave before pytest writes one.
    "forged_report_then_exit": "import os, pathlib\n"
    "for d in (pathlib.Path.cwd().parent / 'eval', pathlib.Path.cwd()):\n"
    "    (d / 'junit.xml').write_text(" + repr(FORGED) + ")\n"
    "os._exit(0)\n",
}


def _adds(files: Mapping[str, str]) -> Callable[[Path], Mapping[str, str]]:
    return lambda _repo: files


def _prepend_to_pagination(payload: str) -> Callable[[Path], Mapping[str, str]]:
    return lambda repo: {"pagination.py": payload + (repo / "pagination.py").read_text()}


def _stopped_pytest(result: EvaluationResult, patch: bytes | None) -> None:
    assert result.status is TerminalStatus.UNRESOLVED, result.error_message
    assert result.reward == 0.0
    assert "wrote no JUnit report" in result.error_message
    assert {o.status for o in result.test_outcomes} == {TestStatus.MISSING}


REWARDS = {
    "nan": '{"reward": NaN}',
    "inf": '{"reward": Infinity}',
    "minus_inf": '{"reward": -Infinity}',
    "nan_trace_reward": '{"reward": 1.0, "trace_rewards": [NaN]}',
    "nan_string": '{"reward": "nan"}',
}


def _non_finite_refused(result: EvaluationResult, patch: bytes | None) -> None:
    assert result.status is TerminalStatus.INFRA_ERROR
    assert not result.status.trainable
    assert result.reward == 0.0
    assert "non-finite reward" in result.error_message
    assert json.loads(json.dumps(result.to_dict()))["reward"] == 0.0


BIG_FILE = {"big.txt": "x" * 8192 + "\n"}


def _oversize_refused(result: EvaluationResult, patch: bytes | None) -> None:
    assert patch is not None
    assert result.status is TerminalStatus.INVALID_PATCH
    assert str(len(patch)) in result.error_message
    assert "4096" in result.error_message


# Imported by the tests: writes 16 MiB files far past the evaluator's 64 MiB quota (each under the 1 GiB file
# size limit), then waits, so only the quota can stop it.
DISK_FILL = """\
import pathlib, time
_chunk = b"x" * (1 << 20)
for _i in range(48):
    with open(pathlib.Path.cwd() / f"fill{_i}.bin", "wb") as _f:
        for _ in range(16):
            _f.write(_chunk)
time.sleep(60)
"""
DISK_LIMIT = "64m"


def _over_quota(result: EvaluationResult, patch: bytes | None) -> None:
    # The patch's fault, not the infrastructure's: unresolved, reward 0, the quota named.
    assert result.status is TerminalStatus.UNRESOLVED, result.error_message
    assert result.reward == 0.0
    assert "disk quota" in result.error_message
    assert "quota 64 MiB" in result.error_message
    assert {o.status for o in result.test_outcomes} == {TestStatus.MISSING}


ATTACKS: dict[str, Attack] = {
    **{f"config:{n}": Attack(_adds({n: c, **PLUGIN}), _config_ignored(n), "bare", True) for n, c in CONFIGS.items()},
    "pytest.toml_over_the_repositorys_pytest.ini": Attack(
        _adds({"pytest.toml": CONFIGS["pytest.toml"], **PLUGIN}), _repo_config_kept, naive=True
    ),
    "config_deselecting_the_failing_tests": Attack(_adds(DESELECT), _nothing_deselected),
    **{
        f"conftest:{where}": Attack(_adds({where: FORCE_PASS}), _conftest_removed(where), naive=True)
        for where in ("conftest.py", "tests/conftest.py")
    },
    "entry_point_plugin": Attack(_adds(ENTRY_POINT), _entry_point_not_loaded, naive=True),
    # As if the image (or anything but the evaluator) set them: the test run gets them empty. The plugin module
    # is an ordinary source file a patch may add; only loading it would cheat.
    "pytest_plugins_and_addopts_in_the_environment": Attack(
        _adds(PLUGIN), _honest, extra_env={"PYTEST_PLUGINS": "evil_plugin", "PYTEST_ADDOPTS": "-p evil_plugin"}
    ),
    **{f"kill_pytest_at_import:{k}": Attack(_prepend_to_pagination(v), _stopped_pytest) for k, v in KILLERS.items()},
    **{
        f"reward_json:{k}": Attack(None, _non_finite_refused, "command", command=f"echo '{v}' > \"$POLAR_REWARD_FILE\"")
        for k, v in REWARDS.items()
    },
    "oversize_patch": Attack(
        _adds({"big.txt": "x" * 8192 + "\n"}), _oversize_refused, settings={"max_patch_bytes": 4096}
    ),
    "tests_fill_the_disk": Attack(_prepend_to_pagination(DISK_FILL), _over_quota, settings={"disk_limit": DISK_LIMIT}),
}


def _setup(attack: Attack, work: Path) -> tuple[EvaluatorSpec, Path | None, bytes | None]:
    """The spec, the repository and the patch of ``attack``; a ``bare`` repository is copied below ``work``."""
    if attack.base == "command":
        return EvaluatorSpec("command", {"command": attack.command}), None, None
    spec, _ = example_spec("paginate")
    repo = Path(spec.options["repo"])
    if attack.base == "bare":
        copy = work / "bare"
        shutil.copytree(repo, copy, ignore=shutil.ignore_patterns("__pycache__", "pytest.ini"))
        spec, repo = dataclasses.replace(spec, options={**spec.options, "repo": str(copy)}), copy
    patch = make_patch(repo, attack.changes(repo)) if attack.changes is not None else None
    return spec, repo, patch


@pytest.mark.parametrize("name", list(ATTACKS))
async def test_attack_gets_the_honest_verdict(tmp_path: Path, name: str) -> None:
    attack = ATTACKS[name]
    spec, repo, patch = _setup(attack, tmp_path)
    if attack.naive:
        assert repo is not None
        assert patch is not None
        assert _naive_run(repo, patch, tmp_path) == 0
    svc = editable_service(tmp_path, attack.extra_env, **attack.settings)
    try:
        result = await evaluate_once(svc, spec, patch)
    finally:
        await svc.close()
    attack.check(result, patch)


@pytest.mark.parametrize("name", list(ATTACKS))
async def test_attack_gets_the_honest_verdict_as_an_unprivileged_user(user_dir: tuple[str, Path], name: str) -> None:
    user, directory = user_dir
    attack = ATTACKS[name]
    spec, _, patch = _setup(attack, directory)
    case: dict[str, Any] = {
        "root": str(directory / "evaluator"),
        "strategy": spec.strategy,
        "options": dict(spec.options),
        "patch": None,
        "settings": {**attack.settings, "task_roots": [str(directory), str(EXAMPLE_TASKS_DIR)]},
        "extra_env": dict(attack.extra_env),
    }
    if patch is not None:
        (directory / "agent.patch").write_bytes(patch)
        case["patch"] = str(directory / "agent.patch")
    if not user:
        # Already unprivileged (the fixture says so): evaluate in this process.
        attack.check(await run_case(case), patch)
        return
    # The system Python (the one running the tests may live where the user cannot read, e.g. /root), with this
    # one's packages on its path; the tests in the runtime run with it, so the runtime gets them too.
    site = sysconfig.get_paths()["purelib"]
    case["site_dirs"] = [site]
    (directory / "case.json").write_text(json.dumps(case))
    returncode, stdout, stderr = await run_module_as(
        user, "integration_tests.support.evaluator", str(directory / "case.json"), timeout_s=110, extra_path=[site]
    )
    assert returncode == 0, stderr.decode()[-2000:]
    result = EvaluationResult.from_dict(json.loads(stdout.splitlines()[-1]))
    assert Path(result.log_ref).is_relative_to(directory)
    assert _owner(result.log_ref) != 0  # written by the unprivileged evaluator
    attack.check(result, patch)


# -- What the table does not cover -------------------------------------------------------------------------


async def test_python_without_pytest_is_still_infra_error(tmp_path: Path) -> None:
    # No report because the environment is broken, not the patch: not the model's failure.
    if _has_pytest("/usr/bin/python3"):
        pytest.skip("/usr/bin/python3 has pytest here")
    spec, _ = example_spec("paginate")
    spec = dataclasses.replace(spec, options={**spec.options, "python": "/usr/bin/python3"})
    svc = editable_service(tmp_path)
    try:
        result = await evaluate_once(svc, spec, None)
    finally:
        await svc.close()
    assert result.status is TerminalStatus.INFRA_ERROR
    assert "cannot import pytest" in result.error_message


@pytest.mark.parametrize("name", ["oversize_patch", "tests_fill_the_disk"])
async def test_the_evaluator_keeps_serving_after_the_attack(tmp_path: Path, name: str) -> None:
    attack = ATTACKS[name]
    spec, repo, patch = _setup(attack, tmp_path)
    assert repo is not None
    svc = editable_service(tmp_path, **attack.settings)
    try:
        attack.check(await evaluate_once(svc, spec, patch), patch)
        # The next evaluation in the same service is judged as usual: a small change unresolved, the fix resolved.
        small = await evaluate_once(svc, spec, make_patch(repo, {"note.txt": "hi\n"}))
        assert small.status is TerminalStatus.UNRESOLVED, small.error_message
        _, fix = example_spec("paginate")
        fixed = await evaluate_once(svc, spec, fix)
        assert fixed.status is TerminalStatus.RESOLVED, fixed.error_message
    finally:
        await svc.close()
    # Nothing of the evaluations' runtimes is left on the host.
    assert not any((tmp_path / "rt").iterdir())


def test_patch_and_disk_limits_default_to_the_gateways_and_the_runtimes(tmp_path: Path) -> None:
    settings = EvaluatorSettings(state_dir=tmp_path)
    assert settings.max_patch_bytes == 64 * 1024 * 1024
    assert settings.disk_limit == "4g"
    assert EvaluatorSettings(state_dir=tmp_path, disk_limit="").disk_limit is None
    with pytest.raises(ValueError, match="not a size"):
        EvaluatorSettings(state_dir=tmp_path, disk_limit="lots")
