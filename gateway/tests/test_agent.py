"""The real agent runner's and runtime factory's admission checks and proxy-tunnel wiring (no processes)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from gateway.agent import HarnessAgentRunner, SpecRuntimeFactory
from gateway.models import EvaluatorConfig, HarnessConfig, RuntimeConfig, SessionSpec
from gateway.tunnel import ProxyTunnel
from gateway.workspace import _repository
from polar_core.errors import FailedPrecondition, InvalidArgument
from polar_core.git_trees import TreeCache
from polar_core.testing import git, make_history_repo
from runtimes import DefaultRuntimeFactory, Isolation, NetworkMode, OperatorPolicy


def _spec(harness: str = "command", options: dict[str, Any] | None = None, **runtime: Any) -> SessionSpec:
    return SessionSpec(
        session_id="s",
        task_id="t",
        harness=HarnessConfig(harness, options if options is not None else {"argv": ["true"]}),
        runtime=RuntimeConfig(options=runtime),
    )


def _factory(tmp_path: Path) -> SpecRuntimeFactory:
    return SpecRuntimeFactory(
        DefaultRuntimeFactory(base_dir=tmp_path),
        defaults={"network": "proxy", "read_only_paths": ["/opt/harnesses"]},
        tunnel=ProxyTunnel(tmp_path / "tun", sandbox_port=18123),
        policy=OperatorPolicy(read_only_roots=(Path("/data"),)),
    )


def test_proxy_network_gets_the_tunnel_socket(tmp_path: Path) -> None:
    spec = _factory(tmp_path).runtime_spec(_spec(read_only_paths=["/data/x"], proxy_port=18124.0))
    assert spec.network is NetworkMode.PROXY
    assert spec.proxy_socket == tmp_path / "tun" / "proxy.sock"
    assert spec.proxy_port == 18124
    assert spec.read_only_paths == (Path("/opt/harnesses"), Path("/data/x"))
    assert spec.min_isolation is Isolation.BWRAP
    assert _factory(tmp_path).runtime_spec(_spec(network="none")).network is NetworkMode.NONE


@pytest.mark.parametrize(
    ("runtime", "field"),
    [
        ({"network": "host"}, "network"),
        ({"isolation": "none"}, "isolation"),
        ({"proxy_socket": "/tmp/other.sock"}, "proxy_socket"),
        ({"read_only_paths": ["/etc"]}, "read_only_paths"),
        ({"env": {"OPENAI_BASE_URL": "http://evil"}}, "env.OPENAI_BASE_URL"),
        ({"memory_limit": "64g"}, "memory_limit"),
    ],
)
def test_a_task_cannot_widen_the_gateways_runtime(tmp_path: Path, runtime: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        _factory(tmp_path).validate(_spec(**runtime))
    assert info.value.details["field"] == field


def test_repository_paths_must_lie_under_the_task_roots(tmp_path: Path) -> None:
    root, outside = tmp_path / "tasks", tmp_path / "elsewhere"
    (root / "repo").mkdir(parents=True)
    outside.mkdir()
    (root / "link").symlink_to(outside)
    runner = HarnessAgentRunner(task_roots=[root])
    runner.validate(dataclasses.replace(_spec(), metadata={"repo": str(root / "repo")}))
    for repo in (outside, root / "link", root / ".." / "elsewhere"):
        with pytest.raises(InvalidArgument, match="not under the operator's task roots") as info:
            runner.validate(dataclasses.replace(_spec(), metadata={"repo": str(repo)}))
        assert info.value.details["field"] == "metadata.repo"
    patch = dataclasses.replace(_spec(), evaluator=EvaluatorConfig("swe", {"test_patch": str(outside / "t.diff")}))
    with pytest.raises(InvalidArgument, match=r"evaluator\.test_patch"):
        runner.validate(patch)


@pytest.mark.parametrize(
    ("harness", "options", "runtime"),
    [
        ("nope", {}, {}),
        ("pi", {"provider_mode": "telepathy"}, {}),
        ("codex", {"unknown": 1}, {}),
        ("command", {"argv": "not a list"}, {}),
        ("command", {"argv": ["true"]}, {"env": "not a mapping"}),
        ("command", {"argv": ["true"]}, {"isolation": "chroot"}),
    ],
)
def test_malformed_tasks_are_refused(tmp_path: Path, harness: str, options: dict[str, Any], runtime: Any) -> None:
    spec = _spec(harness, options, **runtime)

    def admit() -> None:
        HarnessAgentRunner().validate(spec)
        _factory(tmp_path).validate(spec)

    with pytest.raises(InvalidArgument):
        admit()


def test_a_relative_repository_is_refused_at_admission_and_a_missing_one_at_init(tmp_path: Path) -> None:
    relative = dataclasses.replace(_spec(), evaluator=EvaluatorConfig("swe", {"repo": "repo"}))
    with pytest.raises(InvalidArgument, match="relative path"):
        HarnessAgentRunner().validate(relative)
    missing = dataclasses.replace(_spec(), metadata={"repo": str(tmp_path / "nowhere")})
    HarnessAgentRunner().validate(missing)  # it may exist on the gateway host that runs the session
    with pytest.raises(FailedPrecondition, match="does not exist on this gateway"):
        _repository(str(tmp_path / "nowhere"))
    assert _repository(str(tmp_path)) == tmp_path


def test_well_formed_task_passes(tmp_path: Path) -> None:
    spec = _spec("claude-code", {"bare": True})
    HarnessAgentRunner().validate(spec)
    _factory(tmp_path).validate(spec)


async def test_long_state_dirs_get_a_short_socket_path(tmp_path: Path) -> None:
    tunnel = ProxyTunnel.under(tmp_path / ("x" * 120))
    assert len(str(tunnel.socket_path)) <= 100
    assert tunnel.socket_path.parent.is_dir()
    await tunnel.close()
    assert not tunnel.socket_path.parent.exists()


def _with_repo(repo: Path, **options: Any) -> SessionSpec:
    return dataclasses.replace(_spec(), evaluator=EvaluatorConfig("swe", {"repo": str(repo), **options}))


def test_base_commit_is_checked_at_admission(tmp_path: Path) -> None:
    repo = make_history_repo(tmp_path / "repo")
    runner = HarnessAgentRunner(trees=TreeCache(tmp_path / "cache"))
    runner.validate(_with_repo(repo.path, base_commit=repo.base))
    runner.validate(_with_repo(repo.path, base_commit="main"))
    runner.validate(_with_repo(repo.path))  # HEAD
    with pytest.raises(InvalidArgument, match="is not a commit"):
        runner.validate(_with_repo(repo.path, base_commit="0" * 40))
    with pytest.raises(InvalidArgument, match="plain ref name"):
        runner.validate(_with_repo(repo.path, base_commit="--output=/tmp/owned"))
    with pytest.raises(InvalidArgument, match="must be a string"):
        runner.validate(_with_repo(repo.path, base_commit=12.0))
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(InvalidArgument, match="needs a git repository"):
        runner.validate(_with_repo(plain, base_commit=repo.base))
    runner.validate(_with_repo(plain))
    sub = make_history_repo(tmp_path / "sub")
    git(repo.path, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(sub.path), "vendor/sub")
    git(repo.path, "commit", "-qm", "add a submodule")
    with pytest.raises(InvalidArgument, match="submodule"):
        runner.validate(_with_repo(repo.path, base_commit="main"))
    runner.validate(_with_repo(repo.path, base_commit=repo.base))  # the base itself has none
