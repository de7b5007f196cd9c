"""The operator's policy: a task's runtime table may narrow what the operator allows, never widen it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from polar_core.errors import InvalidArgument
from runtimes import Isolation, NetworkMode, RuntimeKind
from runtimes.sandbox_policy import OperatorPolicy, TaskAdmission, apply_task_runtime

_OPERATOR: dict[str, Any] = {
    "network": "proxy",
    "proxy_socket": "/run/polar/proxy.sock",
    "read_only_paths": ["/opt/harnesses"],
    "memory_limit": "4g",
    "pids_limit": 256,
    "cpus": 2.0,
    "cpu_time_limit_s": 600,
    "file_size_limit": "1g",
    "tmp_size": "512m",
    "env": {"OPERATOR": "1"},
    "image": "registry.example/polar/base:1",
}
_POLICY = OperatorPolicy(read_only_roots=(Path("/data"),), images=("registry.example/polar/*",))


def _apply(table: dict[str, Any], policy: OperatorPolicy = _POLICY, **operator: Any) -> Any:
    return apply_task_runtime(policy, {**_OPERATOR, **operator}, table)


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ({"network": "host"}, "network"),
        ({"isolation": "unshare"}, "isolation"),
        ({"isolation": "none"}, "isolation"),
        ({"memory_limit": "8g"}, "memory_limit"),
        ({"pids_limit": 257}, "pids_limit"),
        ({"cpus": 4}, "cpus"),
        ({"cpus": None}, "cpus"),
        ({"cpu_time_limit_s": 601}, "cpu_time_limit_s"),
        ({"cpu_time_limit_s": None}, "cpu_time_limit_s"),
        ({"file_size_limit": "2g"}, "file_size_limit"),
        ({"tmp_size": "1g"}, "tmp_size"),
        ({"read_only_paths": ["/etc"]}, "read_only_paths"),
        ({"read_only_paths": ["relative"]}, "read_only_paths"),
        ({"read_only_root": False}, "read_only_root"),
        ({"proxy_socket": "/tmp/mine.sock"}, "proxy_socket"),
        ({"docker_host": "tcp://10.0.0.1:2375"}, "docker_host"),
        ({"container_root": "/"}, "container_root"),
        ({"sandbox_uid": 0}, "sandbox_uid"),
        ({"sandbox_gid": 0}, "sandbox_gid"),
        ({"min_isolation": "none"}, "min_isolation"),
        ({"env": {"PATH": "/evil"}}, "env.PATH"),
        ({"env": {"HOME": "/root"}}, "env.HOME"),
        ({"env": {"LD_PRELOAD": "/x.so"}}, "env.LD_PRELOAD"),
        ({"env": {"LD_LIBRARY_PATH": "/x"}}, "env.LD_LIBRARY_PATH"),
        ({"env": {"https_proxy": "http://x"}}, "env.https_proxy"),
        ({"env": {"ANTHROPIC_BASE_URL": "http://x"}}, "env.ANTHROPIC_BASE_URL"),
        ({"env": {"POLAR_SESSION_TOKEN": "x"}}, "env.POLAR_SESSION_TOKEN"),
        ({"image": "docker.io/evil:latest"}, "image"),
        ({"kind": "docker", "image": "docker.io/evil:latest"}, "image"),
    ],
)
def test_each_widening_is_refused_naming_the_field(table: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        _apply(table)
    assert info.value.details["field"] == field
    assert field.split(".")[0] in info.value.message


def test_a_container_operator_refuses_a_local_task() -> None:
    with pytest.raises(InvalidArgument) as info:
        _apply({"kind": "local"}, kind="docker")
    assert info.value.details["field"] == "kind"


def test_an_operator_floor_set_explicitly_is_kept() -> None:
    with pytest.raises(InvalidArgument, match="at least 'bwrap'"):
        _apply({"isolation": "unshare"}, OperatorPolicy(min_isolation=Isolation.UNSHARE), isolation="bwrap")
    weak = OperatorPolicy(min_isolation=Isolation.NONE)
    assert _apply({"isolation": "unshare"}, weak).isolation is Isolation.UNSHARE
    assert _apply({}, weak).min_isolation is Isolation.NONE


def test_the_operators_options_alone_give_the_operators_spec() -> None:
    spec = _apply({})
    assert spec.network is NetworkMode.PROXY
    assert spec.min_isolation is Isolation.BWRAP
    assert spec.isolation is Isolation.AUTO
    assert spec.pids_limit == 256
    assert spec.env == {"OPERATOR": "1"}
    assert spec.image == "registry.example/polar/base:1"


@pytest.mark.parametrize(
    ("table", "attribute", "value"),
    [
        ({"network": "none"}, "network", NetworkMode.NONE),
        ({"network": "proxy"}, "network", NetworkMode.PROXY),
        ({"isolation": "bwrap"}, "isolation", Isolation.BWRAP),
        ({"isolation": "auto"}, "isolation", Isolation.AUTO),
        ({"memory_limit": "1g"}, "memory_limit", "1g"),
        ({"pids_limit": 64.0}, "pids_limit", 64),
        ({"cpus": 0.5}, "cpus", 0.5),
        ({"cpu_time_limit_s": 60}, "cpu_time_limit_s", 60),
        ({"file_size_limit": "10m"}, "file_size_limit", "10m"),
        ({"tmp_size": "64m"}, "tmp_size", "64m"),
        ({"read_only_root": True}, "read_only_root", True),
        ({"proxy_port": 18999}, "proxy_port", 18999),
        ({"read_only_paths": ["/data/set"]}, "read_only_paths", (Path("/opt/harnesses"), Path("/data/set"))),
        (
            {"read_only_paths": ["/opt/harnesses/x"]},
            "read_only_paths",
            (Path("/opt/harnesses"), Path("/opt/harnesses/x")),
        ),
        ({"env": {"TASK": "2"}}, "env", {"OPERATOR": "1", "TASK": "2"}),
        ({"image": "registry.example/polar/swe:7"}, "image", "registry.example/polar/swe:7"),
        ({"kind": "docker"}, "kind", RuntimeKind.DOCKER),
    ],
)
def test_each_narrowing_is_accepted(table: dict[str, Any], attribute: str, value: Any) -> None:
    assert getattr(_apply(table), attribute) == value


def test_a_read_only_path_that_escapes_its_root_through_a_symlink_is_refused(tmp_path: Path) -> None:
    root, outside = tmp_path / "allowed", tmp_path / "secret"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)
    policy = OperatorPolicy(read_only_roots=(root,))
    assert _apply({"read_only_paths": [str(root)]}, policy).read_only_paths[-1] == root
    with pytest.raises(InvalidArgument, match="read_only_paths"):
        _apply({"read_only_paths": [str(root / "link")]}, policy)


def test_malformed_values_are_refused() -> None:
    for table in ({"network": "internet"}, {"isolation": "chroot"}, {"memory_limit": "lots"}, {"colour": "red"}):
        with pytest.raises(InvalidArgument):
            _apply(table)


def test_task_admission_checks_paths_and_both_runtime_tables(tmp_path: Path) -> None:
    admission = TaskAdmission.of(task_roots=[tmp_path])
    admission.check({"runtime": {"network": "none"}, "metadata": {"repo": str(tmp_path / "r")}})
    with pytest.raises(InvalidArgument, match=r"metadata\.repo"):
        admission.check({"metadata": {"repo": "/etc"}})
    with pytest.raises(InvalidArgument, match=r"runtime\.network"):
        admission.check({"runtime": {"network": "host"}})
    with pytest.raises(InvalidArgument, match=r"evaluator: runtime\.network"):
        admission.check({"evaluator": {"strategy": "swe", "runtime": {"network": "proxy"}}})
    with pytest.raises(InvalidArgument, match=r"evaluator\.test_patch"):
        admission.check({"evaluator": {"strategy": "swe", "test_patch": "/etc/passwd"}})
    with pytest.raises(InvalidArgument, match=r"runtime\.image"):
        admission.check({"runtime": {"kind": "docker", "image": "anything"}})


def test_a_task_may_narrow_the_disk_quota_but_not_widen_or_drop_it() -> None:
    assert _apply({"disk_limit": "128m"}).disk_limit == "128m"
    assert _apply({}).disk_limit == "4g"
    for wider in ("8g", None):
        with pytest.raises(InvalidArgument, match="disk_limit"):
            _apply({"disk_limit": wider})
    assert _apply({"disk_limit": "1t"}, disk_limit=None).disk_limit == "1t"
