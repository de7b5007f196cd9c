"""Harbor task directories end to end: offline image builds, the ``harbor`` evaluator and ``polar run <dir>``.

A private dockerd and the offline Debian test image (``integration_tests/support/docker.py``); the task is the
Terminal-Bench-style "write /app/hello.txt" of ``integration_tests/support/harbor_tasks.py``. One image is built
per module (the content hash is the same for every copy of the task, so later builds reuse it).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from evaluator import Artifacts, EvaluatorService, EvaluatorSettings, EvaluatorSpec, PrepareParams, evaluator_config
from integration_tests.support.docker import private_docker
from integration_tests.support.evaluator import make_patch
from integration_tests.support.harbor_tasks import HELLO, write_harbor_task
from polar_client.formats import harbor
from polar_core.errors import InvalidArgument
from polar_core.records import TerminalStatus
from runtimes import DefaultRuntimeFactory
from runtimes.docker import LABEL_MANAGED

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def docker_env():
    with private_docker() as env:
        yield env


@pytest.fixture(scope="module")
def built(docker_env, tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    _, client, _ = docker_env
    task = write_harbor_task(tmp_path_factory.mktemp("harbor"))
    return task, harbor.task_mapping(task, docker_client=client)


def test_the_build_links_harbor_paths_and_is_cached_by_content(built, docker_env) -> None:
    _, client, _ = docker_env
    task, mapping = built
    image = client.images.get(mapping["runtime"]["image"])
    assert image.labels["polar.harbor.workdir"] == "/app"
    base = Path(mapping["metadata"]["repo"])
    assert (base / "seed.txt").read_text() == "seed\n"  # the image's WORKDIR, copied out as the workspace's base
    assert (base / "notes" / "README").is_file()
    links = client.containers.run(
        image.id, ["sh", "-c", "readlink /app /tests /logs"], remove=True, network_disabled=True
    )
    assert links.decode().split() == ["/polar/session/workspace", "/polar/session/tests", "/polar/session/logs"]
    again = harbor.task_mapping(task, docker_client=client)
    assert again == mapping
    assert client.images.get(mapping["runtime"]["image"]).id == image.id


def test_a_base_image_that_is_not_here_is_refused(docker_env, tmp_path: Path) -> None:
    _, client, _ = docker_env
    task = write_harbor_task(tmp_path, base="registry.example/never-pulled:1")
    with pytest.raises(InvalidArgument, match="never-pulled") as info:
        harbor.task_mapping(task, docker_client=client)
    assert info.value.details["field"] == "environment/Dockerfile FROM"
    tag = harbor.task_mapping(task, build=False)["runtime"]["image"]
    assert not client.images.list(name=tag)  # nothing was built, nothing pulled


# Terminal-Bench 2.0 publishes every task with a prebuilt registry image named in task.toml, next to its Dockerfile.
TB2_IMAGE = "registry.example/terminal-bench/hello-world:20251031"


def test_a_missing_named_image_is_built_from_the_dockerfile_only_when_allowed(
    docker_env, tmp_path: Path, monkeypatch, caplog
) -> None:
    _, client, _ = docker_env
    monkeypatch.delenv("POLAR_BUILD_MISSING_IMAGES", raising=False)
    task = write_harbor_task(tmp_path, "tb2-hello", docker_image=TB2_IMAGE)
    with pytest.raises(InvalidArgument, match="--build-missing-images") as info:
        harbor.task_mapping(task, docker_client=client)
    assert info.value.details["field"] == "environment.docker_image"
    assert TB2_IMAGE in info.value.message
    assert "POLAR_BUILD_MISSING_IMAGES" in info.value.message
    assert not client.images.list(name="polar-harbor/tb2-hello") + client.images.list(
        name="polar-harbor-base/tb2-hello"
    )

    with caplog.at_level(logging.WARNING, logger="runtimes.image_build"):
        mapping = harbor.task_mapping(task, docker_client=client, build_missing_images=True)
    assert [r.getMessage() for r in caplog.records if TB2_IMAGE in r.getMessage()], caplog.text
    assert "environment/Dockerfile instead" in caplog.text
    image = client.images.get(mapping["runtime"]["image"])
    assert mapping["runtime"]["image"].startswith("polar-harbor/tb2-hello:")
    assert image.labels["polar.harbor.workdir"] == "/app"
    assert (Path(mapping["metadata"]["repo"]) / "seed.txt").read_text() == "seed\n"  # the Dockerfile's COPY
    # The task's registry name is never created: a task file cannot plant an image under a name others trust.
    assert not client.images.list(name=TB2_IMAGE.rsplit(":", 1)[0])
    # The operator's setting allows it too (polar run/submit/generate without the flag), and the build is reused.
    monkeypatch.setenv("POLAR_BUILD_MISSING_IMAGES", "1")
    assert harbor.task_mapping(task, docker_client=client) == mapping


def test_polar_run_and_submit_build_a_missing_image_only_with_the_flag(docker_env, tmp_path: Path) -> None:
    daemon, client, _ = docker_env
    task = write_harbor_task(tmp_path, "tb2-cli", docker_image=TB2_IMAGE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")}
    env["DOCKER_HOST"] = daemon.url
    run = [sys.executable, "-m", "polar_run", "run", str(task), "--out", str(tmp_path / "run"), "--harness", "command"]

    def polar(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)

    refused = polar(*run)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "--build-missing-images" in refused.stderr, refused.stderr
    assert TB2_IMAGE in refused.stderr
    assert not (tmp_path / "run").exists()
    assert not client.images.list(name="polar-harbor/tb2-cli")
    # polar submit reads (and builds) the task before it connects: port 1 on the loopback answers nobody.
    submit = [sys.executable, "-m", "polar_run", "submit", str(task), "--server", "127.0.0.1:1"]
    refused = polar(*submit)
    assert refused.returncode == 2, refused.stderr
    assert "--build-missing-images" in refused.stderr
    allowed = polar(*submit, "--build-missing-images")
    assert "environment/Dockerfile instead" in allowed.stderr, allowed.stderr
    assert "UNAVAILABLE" in allowed.stderr, allowed.stderr  # built, then the submission itself had nowhere to go
    assert client.images.list(name="polar-harbor/tb2-cli")


def test_a_directory_of_harbor_tasks_is_a_generate_dataset(docker_env, tmp_path: Path, monkeypatch) -> None:
    from polar_run.dataset import load_dataset
    from polar_run.run_config import RunOverrides, prepare_task
    from polar_run.run_generate import GenerateOptions, _stack_options

    daemon, _, _ = docker_env
    monkeypatch.setenv("DOCKER_HOST", daemon.url)  # what ``polar generate`` builds on: the runtimes' daemon
    write_harbor_task(tmp_path, "hello-b")
    write_harbor_task(tmp_path, "hello-a")
    tasks = load_dataset(tmp_path)
    assert [(t.task_id, t.repository, t.path.parent.name) for t in tasks] == [
        ("hello-a", "hello-a", "hello-a"),
        ("hello-b", "hello-b", "hello-b"),
    ]
    overrides = RunOverrides(harness="command")
    data = [{**t.data, "harness": {"name": "command", "argv": ["true"]}} for t in tasks]
    prepared = [prepare_task(t.path, overrides, data=d) for t, d in zip(tasks, data, strict=True)]
    assert [p.task_dir for p in prepared] == [tmp_path / "hello-a", tmp_path / "hello-b"]
    options = _stack_options(GenerateOptions(dataset=tmp_path, out=tmp_path / "out"), prepared)
    # The embedded stack, as the operator, allows exactly the images this run built, and nothing else.
    assert options.allowed_images == tuple(sorted({t.data["runtime"]["image"] for t in tasks}))
    for p in prepared:
        options.admission().check(p.task)


@pytest.fixture
async def service(tmp_path: Path, docker_env, built):
    _, client, _ = docker_env
    factory = DefaultRuntimeFactory(base_dir=tmp_path / "rt", docker_client=client)
    settings = EvaluatorSettings(state_dir=tmp_path / "state", allowed_images=["polar-harbor/*"])
    svc = EvaluatorService(evaluator_config(settings), runtime_factory=factory)
    yield svc
    await svc.close()
    assert client.containers.list(all=True, filters={"label": f"{LABEL_MANAGED}=true"}) == []


def _spec(mapping: dict[str, Any], **changes: Any) -> EvaluatorSpec:
    options = {k: v for k, v in mapping["evaluator"].items() if k != "strategy"}
    return EvaluatorSpec(strategy="harbor", options={**options, **changes})


async def _evaluate(svc: EvaluatorService, mapping: dict[str, Any], patch: bytes | None, **changes: Any):
    params = PrepareParams(spec=_spec(mapping, **changes), image=mapping["runtime"]["image"], session_id="s")
    handle = await svc.prepare(params)
    return await svc.evaluate(handle, Artifacts(patch=patch))


async def test_the_solution_resolves(service, built) -> None:
    _, mapping = built
    base = Path(mapping["metadata"]["repo"])
    result = await _evaluate(service, mapping, make_patch(base, {"hello.txt": HELLO + "\n"}))
    assert (result.status, result.reward) == (TerminalStatus.RESOLVED, 1.0), result.error_message


async def test_no_op_and_wrong_output_are_not_rewarded(service, built) -> None:
    _, mapping = built
    base = Path(mapping["metadata"]["repo"])
    result = await _evaluate(service, mapping, None)
    assert (result.status, result.reward) == (TerminalStatus.UNRESOLVED, 0.0)
    wrong = await _evaluate(service, mapping, make_patch(base, {"hello.txt": "Goodbye\n", "seed.txt": "gone\n"}))
    assert (wrong.status, wrong.reward) == (TerminalStatus.UNRESOLVED, 0.0)


async def test_a_patch_cannot_plant_a_reward_or_change_the_tests(service, built) -> None:
    _, mapping = built
    base = Path(mapping["metadata"]["repo"])
    # The agent's copies of Harbor's paths inside its workspace: none of them is what the verifier reads or runs.
    attack = make_patch(
        base,
        {
            "logs/verifier/reward.txt": "1\n",
            "tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
            "tests/test_outputs.py": "def test_ok():\n    pass\n",
            "conftest.py": "import pytest\n\n@pytest.hookimpl(tryfirst=True)\ndef pytest_runtest_call(item):\n"
            "    pass\n",
        },
    )
    result = await _evaluate(service, mapping, attack)
    assert (result.status, result.reward) == (TerminalStatus.UNRESOLVED, 0.0), result.error_message


async def test_a_pytest_module_in_the_workspace_cannot_forge_the_run(service, built) -> None:
    _, mapping = built
    base = Path(mapping["metadata"]["repo"])
    # A pytest.py in WORKDIR that "passes" and writes the reward itself: test.sh's `python3 -m pytest` runs in
    # /app, but with PYTHONSAFEPATH the working directory is not on sys.path, so the real pytest runs.
    forger = "open('/logs/verifier/reward.txt', 'w').write('1')\nraise SystemExit(0)\n"
    forged = make_patch(base, {"pytest.py": forger})
    result = await _evaluate(service, mapping, forged)
    assert (result.status, result.reward) == (TerminalStatus.UNRESOLVED, 0.0), result.error_message
    unguarded = await _evaluate(service, mapping, forged, env={"PYTHONSAFEPATH": ""})  # the attack is real
    assert unguarded.reward == 1.0


async def test_a_patch_cannot_reach_outside_the_workspace(service, built) -> None:
    _, mapping = built
    # A patch that reaches outside the workspace, into the session's logs: git refuses it.
    escape = (
        b"diff --git a/../logs/verifier/reward.txt b/../logs/verifier/reward.txt\nnew file mode 100644\n"
        b"--- /dev/null\n+++ b/../logs/verifier/reward.txt\n@@ -0,0 +1 @@\n+1\n"
    )
    result = await _evaluate(service, mapping, escape)
    assert result.reward == 0.0
    assert result.status in (TerminalStatus.INVALID_PATCH, TerminalStatus.UNRESOLVED)


def _tests_variant(built: tuple[Path, dict[str, Any]], name: str, test_sh: str) -> str:
    task, _ = built
    tests = task / f"tests-{name}"
    tests.mkdir(exist_ok=True)
    (tests / "test.sh").write_text(test_sh)
    return str(tests)


@pytest.mark.parametrize(
    ("name", "test_sh", "why"),
    [
        ("nan", "echo nan > /logs/verifier/reward.txt\n", "non-finite"),
        ("words", "echo passed > /logs/verifier/reward.txt\n", "not a number"),
        ("json", 'echo \'{"reward": "yes"}\' > /logs/verifier/reward.json\n', "non-numeric"),
        ("none", "echo no reward written\n", "wrote no /logs/verifier/reward.txt"),
    ],
)
async def test_missing_or_garbage_rewards_are_unresolved(service, built, name: str, test_sh: str, why: str) -> None:
    _, mapping = built
    tests_dir = _tests_variant(built, name, test_sh)
    result = await _evaluate(service, mapping, None, tests_dir=tests_dir)
    assert (result.status, result.reward) == (TerminalStatus.UNRESOLVED, 0.0)
    assert why in result.error_message


async def test_json_rewards_and_the_verifier_timeout(service, built) -> None:
    _, mapping = built
    partial = _tests_variant(built, "partial", 'echo "{\\"reward\\": $SHARE}" > /logs/verifier/reward.json\n')
    result = await _evaluate(service, mapping, None, tests_dir=partial, env={"SHARE": "0.5"})  # [verifier.env]
    assert (result.status, result.reward) == (TerminalStatus.UNRESOLVED, 0.5), result.error_message
    slow = _tests_variant(built, "slow", "sleep 60\necho 1 > /logs/verifier/reward.txt\n")
    result = await _evaluate(service, mapping, None, tests_dir=slow, verifier_timeout_seconds=2)
    assert result.status is TerminalStatus.EVAL_TIMEOUT
    assert result.reward == 0.0


# The scripted model writes the file with the shell tool, then answers (the AGENT of support/polar_cli.py).
_SOLVE = f"echo '{HELLO}' > /app/hello.txt && cat /app/seed.txt"
_SCRIPT = [
    {"text": "<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": _SOLVE}}) + "\n</tool_call>"},
    {"text": "I wrote /app/hello.txt."},
]


@pytest.mark.parametrize(
    "flags", [pytest.param([], id="dockerfile"), pytest.param(["--build-missing-images"], id="tb2-missing-image")]
)
def test_polar_run_on_a_harbor_directory(docker_env, tmp_path: Path, flags: list[str]) -> None:
    from integration_tests.support.polar_cli import AGENT

    daemon, _, _ = docker_env
    agent = json.dumps(["python3", "-c", AGENT])  # a JSON array of strings is a TOML array too
    # tb2-missing-image: the task as Terminal-Bench 2.0 publishes it, its registry image absent (built, with the flag).
    task = write_harbor_task(tmp_path, docker_image=TB2_IMAGE if flags else "")
    harness = f'[metadata.polar]\nharness = {{ name = "command", argv = {agent} }}\n\n[verifier]\n'
    (task / "task.toml").write_text((task / "task.toml").read_text().replace("[verifier]\n", harness, 1))
    script = tmp_path / "turns.jsonl"
    script.write_text("".join(json.dumps(t) + "\n" for t in _SCRIPT))
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")}
    env["DOCKER_HOST"] = daemon.url
    argv = [sys.executable, "-m", "polar_run", "run", str(task), "--out", str(out), "--backend", "scripted",
            "--backend-option", f"script={script}", "--model", "tiny", *flags]  # fmt: skip
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "sessions.jsonl").read_text().splitlines()]
    assert [(r["status"], r["reward"]) for r in rows] == [("resolved", 1.0)], rows
    patch = (out / rows[0]["files"] / "patch.diff").read_text()
    assert "+++ b/hello.txt" in patch
    assert HELLO in patch
    assert "seed.txt" not in patch
    shutil.rmtree(out / "state", ignore_errors=True)
