"""The evaluator's core cases in the Docker runtime (private dockerd; skipped when absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluator import (
    Artifacts,
    EvaluatorService,
    EvaluatorSettings,
    EvaluatorSpec,
    PrepareParams,
    TestStatus,
    evaluator_config,
)
from integration_tests.support.docker import private_docker
from integration_tests.support.evaluator import example_spec, make_patch
from polar_core.records import TerminalStatus
from runtimes import DefaultRuntimeFactory
from runtimes.docker import LABEL_MANAGED

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def docker_env():
    with private_docker() as (_, client, image):
        yield client, image


@pytest.fixture
async def service(tmp_path: Path, docker_env):
    client, image = docker_env
    factory = DefaultRuntimeFactory(base_dir=tmp_path / "rt", docker_client=client)
    # The session's image reaches the evaluator from the task: the operator allows it by name.
    settings = EvaluatorSettings(state_dir=tmp_path / "state", allowed_images=[image])
    svc = EvaluatorService(evaluator_config(settings), runtime_factory=factory)
    yield svc
    await svc.close()
    assert client.containers.list(all=True, filters={"label": f"{LABEL_MANAGED}=true"}) == []


async def _evaluate(svc, image: str, spec: EvaluatorSpec, artifacts: Artifacts, **kw):
    handle = await svc.prepare(PrepareParams(spec=spec, image=image, session_id="s"))
    return handle, await svc.evaluate(handle, artifacts, **kw)


async def test_reference_fix_resolves_and_repeat_is_stored(service, docker_env) -> None:
    _, image = docker_env
    spec, fix = example_spec("deep_merge")
    handle, result = await _evaluate(service, image, spec, Artifacts(patch=fix))
    assert result.status is TerminalStatus.RESOLVED, result.error_message
    assert all(o.status is TestStatus.PASSED for o in result.test_outcomes)
    assert await service.evaluate(handle, Artifacts(patch=b"junk")) == result
    assert service.evaluations_run == 1


async def test_breaking_and_test_editing_patches_are_unresolved(service, docker_env) -> None:
    _, image = docker_env
    spec, _ = example_spec("kv_parser")
    repo = Path(spec.options["repo"])
    source = (repo / "kvparse.py").read_text()
    tests = (repo / "tests" / "test_kvparse.py").read_text()
    breaking = make_patch(repo, {"kvparse.py": source.replace("key.strip()] = value.strip()", "key] = value")})
    _, result = await _evaluate(service, image, spec, Artifacts(patch=breaking))
    assert result.status is TerminalStatus.UNRESOLVED
    cheating = make_patch(repo, {"tests/test_kvparse.py": tests.replace('"abc=="', '"abc"')})
    _, result = await _evaluate(service, image, spec, Artifacts(patch=cheating))
    assert result.status is TerminalStatus.UNRESOLVED
    failed = {o.test_id for o in result.test_outcomes if o.status is not TestStatus.PASSED}
    assert failed == {"tests/test_kvparse.py::test_value_containing_equals"}


async def test_garbage_patch_is_invalid(service, docker_env) -> None:
    _, image = docker_env
    spec, _ = example_spec("intervals")
    _, result = await _evaluate(service, image, spec, Artifacts(patch=b"--- a/x\n+++ b/x\n@@ garbage\n"))
    assert result.status is TerminalStatus.INVALID_PATCH


async def test_killed_container_is_infra_error(service, docker_env) -> None:
    client, image = docker_env
    spec, fix = example_spec("paginate")
    handle = await service.prepare(PrepareParams(spec=spec, image=image, session_id="s"))
    (container,) = client.containers.list(filters={"label": f"{LABEL_MANAGED}=true"})
    container.kill()
    result = await service.evaluate(handle, Artifacts(patch=fix))
    assert result.status is TerminalStatus.INFRA_ERROR


async def test_hanging_test_is_eval_timeout(service, docker_env, tmp_path: Path) -> None:
    _, image = docker_env
    repo = tmp_path / "hang"
    (repo / "tests").mkdir(parents=True)
    (repo / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    (repo / "tests" / "test_hang.py").write_text("import time\n\ndef test_hang():\n    time.sleep(1000)\n")
    spec = EvaluatorSpec("swe", {"repo": str(repo), "fail_to_pass": ["tests/test_hang.py::test_hang"]})
    # The test sleeps 1000 s: the evaluation returning at all (within the per-test timeout) shows the deadline
    # ended it.
    _, result = await _evaluate(service, image, spec, Artifacts(), timeout_s=5.0)
    assert result.status is TerminalStatus.EVAL_TIMEOUT
    assert result.reward == 0.0


async def test_trusted_invocation_holds_against_config_conftest_and_exit(service, docker_env) -> None:
    # The same trusted pytest invocation in the container (its own pytest): a patch adding a pytest.toml that
    # loads a plugin, a conftest forcing every test to pass, or an os._exit(0) at import is judged honestly.
    _, image = docker_env
    spec, _ = example_spec("paginate")
    repo = Path(spec.options["repo"])
    force_pass = (
        "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
        "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
    )
    source = (repo / "pagination.py").read_text()
    attacks = {
        "config": {"pytest.toml": '[pytest]\naddopts = ["-p", "evil"]\npythonpath = ["."]\n', "evil.py": force_pass},
        "conftest": {"conftest.py": force_pass},
        "exit": {"pagination.py": "import os\nos._exit(0)\n" + source},
    }
    for name, changes in attacks.items():
        _, result = await _evaluate(service, image, spec, Artifacts(patch=make_patch(repo, changes)))
        assert result.status is TerminalStatus.UNRESOLVED, (name, result.error_message)
        failing = {o.test_id.split("::")[1] for o in result.test_outcomes if o.status is not TestStatus.PASSED}
        assert "test_partial_last_page" in failing, name
