"""The evaluator end to end with the local (bubblewrap) runtime and the shipped example tasks."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from evaluator import (
    AgentStatus,
    Artifacts,
    EvaluatorService,
    EvaluatorSettings,
    EvaluatorSpec,
    PrepareParams,
    TestStatus,
    evaluator_config,
)
from integration_tests.support.evaluator import example_names, example_spec, make_patch
from polar_core.records import TerminalStatus
from runtimes import DefaultRuntimeFactory, Runtime, RuntimeSpec
from runtimes.local import LocalRuntime


class RecordingFactory(DefaultRuntimeFactory):
    """The default factory, remembering what it built (so a test can break a runtime)."""

    def __init__(self, base_dir: Path) -> None:
        super().__init__(base_dir=base_dir)
        self.built: list[Runtime] = []

    def create(self, spec: RuntimeSpec, *, session_id: str) -> Runtime:
        runtime = super().create(spec, session_id=session_id)
        self.built.append(runtime)
        return runtime


@pytest.fixture
def factory(tmp_path: Path) -> RecordingFactory:
    return RecordingFactory(tmp_path / "runtimes")


@pytest.fixture
async def service(tmp_path: Path, factory: RecordingFactory):
    svc = EvaluatorService(evaluator_config(EvaluatorSettings(state_dir=tmp_path / "state")), runtime_factory=factory)
    yield svc
    await svc.close()


async def _evaluate(svc: EvaluatorService, spec: EvaluatorSpec, artifacts: Artifacts, **kw):
    handle = await svc.prepare(PrepareParams(spec=spec, task_id="t"))
    return handle, await svc.evaluate(handle, artifacts, **kw)


@pytest.mark.parametrize("name", example_names())
async def test_reference_fix_resolves_and_no_patch_does_not(service, name: str) -> None:
    spec, fix = example_spec(name)
    _, fixed = await _evaluate(service, spec, Artifacts(patch=fix))
    assert fixed.status is TerminalStatus.RESOLVED, fixed.error_message
    assert fixed.reward == 1.0
    assert all(o.status is TestStatus.PASSED for o in fixed.test_outcomes)
    _, unfixed = await _evaluate(service, spec, Artifacts(patch=None))
    assert unfixed.status is TerminalStatus.UNRESOLVED
    assert unfixed.reward == 0.0
    failing = {o.test_id for o in unfixed.test_outcomes if o.status is not TestStatus.PASSED}
    assert failing == set(spec.options["fail_to_pass"])


async def test_patch_breaking_a_passing_test_is_unresolved(service) -> None:
    spec, _ = example_spec("paginate")
    repo = Path(spec.options["repo"])
    source = (repo / "pagination.py").read_text()
    # Fixes the bug and breaks page_items, which a PASS_TO_PASS test covers.
    broken = source.replace("return total // per_page", "return -(-total // per_page)").replace(
        "start = (page - 1) * per_page", "start = page * per_page - per_page + 1"
    )
    patch = make_patch(repo, {"pagination.py": broken})
    _, result = await _evaluate(service, spec, Artifacts(patch=patch))
    assert result.status is TerminalStatus.UNRESOLVED
    outcomes = {o.test_id.split("::")[1]: o.status for o in result.test_outcomes}
    assert outcomes["test_partial_last_page"] is TestStatus.PASSED
    assert outcomes["test_page_items"] is TestStatus.FAILED


async def test_patch_editing_tests_is_judged_on_the_original_tests(service) -> None:
    spec, _ = example_spec("paginate")
    repo = Path(spec.options["repo"])
    tests = (repo / "tests" / "test_pagination.py").read_text()
    cheating = {
        # Weaken the failing tests, and add a conftest that marks everything passed.
        "tests/test_pagination.py": tests.replace("== 3", "== 2").replace("== 1", "== 0"),
        "conftest.py": "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\n"
        "def pytest_runtest_makereport(item, call):\n"
        "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n",
        "tests/test_extra.py": "def test_nothing():\n    pass\n",
    }
    patch = make_patch(repo, cheating)
    _, result = await _evaluate(service, spec, Artifacts(patch=patch))
    assert result.status is TerminalStatus.UNRESOLVED
    outcomes = {o.test_id.split("::")[1]: o.status for o in result.test_outcomes}
    assert outcomes["test_partial_last_page"] is TestStatus.FAILED
    log = await asyncio.to_thread(Path(result.log_ref).read_text)
    assert "restored the task's own test files" in log
    assert "conftest.py" in log


async def test_patch_deleting_a_test_file_is_judged_on_the_original(service) -> None:
    spec, fix = example_spec("intervals")
    patch = make_patch(Path(spec.options["repo"]), {"tests/test_intervals.py": None}, base_patch=fix)
    _, result = await _evaluate(service, spec, Artifacts(patch=patch))
    assert result.status is TerminalStatus.RESOLVED
    assert len(result.test_outcomes) == 5


async def test_garbage_patch_is_invalid_patch(service) -> None:
    spec, _ = example_spec("kv_parser")
    garbage = b"diff --git a/kvparse.py b/kvparse.py\n--- a/kvparse.py\n+++ b/kvparse.py\n@@ -1,3 +1,3 @@\n-nope\n+x\n"
    _, result = await _evaluate(service, spec, Artifacts(patch=garbage))
    assert result.status is TerminalStatus.INVALID_PATCH
    assert result.reward == 0.0
    assert result.error_message
    _, result = await _evaluate(service, spec, Artifacts(patch=b"this is not a diff at all"))
    assert result.status is TerminalStatus.INVALID_PATCH


async def test_runtime_that_dies_is_infra_error(service, factory) -> None:
    spec, fix = example_spec("deep_merge")
    handle = await service.prepare(PrepareParams(spec=spec))
    runtime = factory.built[-1]
    assert isinstance(runtime, LocalRuntime)
    root = runtime.host_root
    if root.is_symlink():  # a link to the session's own disk image (started as root)
        shutil.rmtree(root.resolve(), ignore_errors=True)  # its mount point itself stays
        root.unlink()
    else:
        shutil.rmtree(root)  # the sandbox vanishes underneath the evaluator
    result = await service.evaluate(handle, Artifacts(patch=fix))
    assert result.status is TerminalStatus.INFRA_ERROR
    assert result.error_message


@pytest.fixture
def hanging_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "hang"
    (repo / "tests").mkdir(parents=True)
    (repo / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    (repo / "tests" / "test_hang.py").write_text(
        "import subprocess, time\n\ndef test_ok():\n    pass\n\n"
        "def test_hang():\n    subprocess.Popen(['sleep', '1000'])\n    time.sleep(1000)\n"
    )
    return repo


async def test_hanging_test_is_eval_timeout(service, factory: RecordingFactory, hanging_repo: Path) -> None:
    # The test sleeps 1000 s: the evaluation returning at all (within the per-test timeout) shows the deadline
    # ended it; the runtime and the process tree it held are gone.
    spec = EvaluatorSpec(
        "swe", {"repo": str(hanging_repo), "fail_to_pass": ["tests/test_hang.py::test_hang"],
                "pass_to_pass": ["tests/test_hang.py::test_ok"]},
    )  # fmt: skip
    _, result = await _evaluate(service, spec, Artifacts(), timeout_s=4.0)
    assert result.status is TerminalStatus.EVAL_TIMEOUT
    assert result.reward == 0.0
    (runtime,) = factory.built
    assert isinstance(runtime, LocalRuntime)
    assert not runtime.host_root.exists()


async def test_repeated_evaluate_returns_the_stored_result(service) -> None:
    spec, fix = example_spec("money_rounding")
    handle, first = await _evaluate(service, spec, Artifacts(patch=fix))
    assert service.evaluations_run == 1
    again = await service.evaluate(handle, Artifacts(patch=b"garbage"))
    assert again == first
    assert service.evaluations_run == 1
    await service.release(handle)
    assert await service.evaluate(handle, Artifacts()) == first
    assert service.evaluations_run == 1


async def test_concurrent_evaluate_calls_share_one_run(service) -> None:
    spec, fix = example_spec("intervals")
    handle = await service.prepare(PrepareParams(spec=spec))
    results = await asyncio.gather(*(service.evaluate(handle, Artifacts(patch=fix)) for _ in range(3)))
    assert {r.status for r in results} == {TerminalStatus.RESOLVED}
    assert service.evaluations_run == 1


@pytest.mark.parametrize(
    ("use_fix", "expected_reward"),
    [(True, 1.0), (False, 0.0)],
)
async def test_agent_timeout_patch_still_evaluated(service, use_fix: bool, expected_reward: float) -> None:
    spec, fix = example_spec("paginate")
    artifacts = Artifacts(patch=fix if use_fix else None, agent_status=AgentStatus.TIMEOUT)
    _, result = await _evaluate(service, spec, artifacts)
    assert result.status is TerminalStatus.AGENT_TIMEOUT
    assert result.reward == expected_reward
    assert result.test_outcomes


async def test_release_during_evaluation_is_cancelled(service, hanging_repo: Path) -> None:
    spec = EvaluatorSpec("swe", {"repo": str(hanging_repo), "fail_to_pass": ["tests/test_hang.py::test_hang"]})
    handle = await service.prepare(PrepareParams(spec=spec))
    task = asyncio.create_task(service.evaluate(handle, Artifacts()))
    await asyncio.sleep(2.0)
    assert await service.release(handle) is True
    result = await asyncio.wait_for(task, 20)
    assert result.status is TerminalStatus.CANCELLED


async def test_command_strategy_reward_json(service, tmp_path: Path) -> None:
    script = (
        'test -f "$POLAR_ARTIFACTS_DIR/answer.txt" && grep -q 42 "$POLAR_ARTIFACTS_DIR/answer.txt" '
        '&& echo \'{"reward": 0.75, "trace_rewards": [0.5, 1.0]}\' > "$POLAR_REWARD_FILE"'
    )
    spec = EvaluatorSpec("command", {"command": script, "resolved_threshold": 0.5})
    _, result = await _evaluate(service, spec, Artifacts(files={"answer.txt": b"42\n"}))
    assert (result.reward, result.status, result.trace_rewards) == (0.75, TerminalStatus.RESOLVED, (0.5, 1.0))
    spec = EvaluatorSpec("command", {"command": ["false"]})
    _, result = await _evaluate(service, spec, Artifacts())
    assert (result.reward, result.status) == (0.0, TerminalStatus.UNRESOLVED)


def _pytest_line(log: str) -> str:
    return next(line for line in log.splitlines() if " -m pytest " in line)


async def test_hypothesis_plugin_is_blocked_only_where_nothing_mentions_it(service, tmp_path: Path) -> None:
    # Hypothesis's plugin costs ~1.2 CPU-s per run; a repository that never names hypothesis runs without it.
    spec, fix = example_spec("paginate")
    _, result = await _evaluate(service, spec, Artifacts(patch=fix))
    assert result.status is TerminalStatus.RESOLVED, result.error_message
    log = await asyncio.to_thread(Path(result.log_ref).read_text)
    assert "-p no:hypothesispytest" in _pytest_line(log)
    # One whose conftest uses Hypothesis (a settings profile) keeps the plugin, and its tests still pass.
    repo = tmp_path / "repo"
    shutil.copytree(spec.options["repo"], repo)
    (repo / "conftest.py").write_text(
        "from hypothesis import settings\n\nsettings.register_profile('polar', max_examples=5)\n"
        "settings.load_profile('polar')\n"
    )
    with_hypothesis = EvaluatorSpec("swe", {**spec.options, "repo": str(repo)})
    _, result = await _evaluate(service, with_hypothesis, Artifacts(patch=fix))
    assert result.status is TerminalStatus.RESOLVED, result.error_message
    log = await asyncio.to_thread(Path(result.log_ref).read_text)
    assert "no:hypothesispytest" not in _pytest_line(log)
