"""The evaluator applies the operator's policy: task runtime tables may only narrow, paths must lie under roots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from evaluator import EvaluatorService, EvaluatorSettings, EvaluatorSpec, PrepareParams
from evaluator.app import EvaluatorApp, evaluator_config
from polar_core.errors import InvalidArgument
from runtimes import Isolation
from runtimes.local import IsolationProbe


def _service(tmp_path: Path, **settings: Any) -> EvaluatorService:
    merged = {"state_dir": tmp_path / "state", "task_roots": [str(tmp_path / "tasks")], **settings}
    return EvaluatorService(evaluator_config(EvaluatorSettings(**merged)))


@pytest.mark.parametrize(
    ("runtime", "field"),
    [
        ({"network": "host"}, "network"),
        ({"isolation": "none"}, "isolation"),
        ({"docker_host": "tcp://10.0.0.1:2375"}, "docker_host"),
        ({"memory_limit": "64g"}, "memory_limit"),
        ({"kind": "docker", "image": "evil:latest"}, "image"),
    ],
)
async def test_a_widening_runtime_table_is_refused_at_prepare(
    tmp_path: Path, runtime: dict[str, Any], field: str
) -> None:
    svc = _service(tmp_path)
    spec = EvaluatorSpec("command", {"command": ["true"], "runtime": runtime})
    with pytest.raises(InvalidArgument) as info:
        await svc.prepare(PrepareParams(spec=spec))
    assert info.value.details["field"] == field
    await svc.close()


async def test_a_session_image_needs_the_operators_allow_list(tmp_path: Path) -> None:
    spec = EvaluatorSpec("command", {"command": ["true"], "runtime": {"network": "none"}})
    svc = _service(tmp_path)
    with pytest.raises(InvalidArgument, match=r"runtime\.image"):
        await svc.prepare(PrepareParams(spec=spec, image="registry.example/swe:1"))
    await svc.close()


async def test_repositories_outside_the_task_roots_are_refused(tmp_path: Path) -> None:
    (tmp_path / "tasks").mkdir()
    (tmp_path / "secret").mkdir()
    (tmp_path / "tasks" / "link").symlink_to(tmp_path / "secret")
    svc = _service(tmp_path)
    for options in ({"repo": str(tmp_path / "secret")}, {"repo": str(tmp_path / "tasks" / "link")},
                    {"test_patch": "/etc/passwd"}):  # fmt: skip
        spec = EvaluatorSpec("swe", {"fail_to_pass": ["t"], **options})
        with pytest.raises(InvalidArgument, match="not under the operator's task roots"):
            await svc.prepare(PrepareParams(spec=spec))
    with pytest.raises(InvalidArgument, match=r"evaluator\.repo"):
        await svc.prepare(PrepareParams(spec=EvaluatorSpec("swe", {}), repository_snapshot=str(tmp_path / "secret")))
    await svc.close()


async def test_the_probe_runs_once_and_its_level_is_used(tmp_path: Path) -> None:
    settings = EvaluatorSettings(state_dir=tmp_path / "state", min_isolation="unshare")
    probe = IsolationProbe(Isolation.UNSHARE, {Isolation.BWRAP: "bubblewrap (bwrap) is not installed"})
    app = await EvaluatorApp.open(settings, isolation=probe)
    try:
        spec = app.service._runtime_spec(PrepareParams(spec=EvaluatorSpec("command", {"command": ["true"]})))
        assert spec.isolation is Isolation.UNSHARE
        assert spec.min_isolation is Isolation.UNSHARE
    finally:
        await app.close()


async def test_the_disk_limit_setting_is_the_runtimes_quota_and_tasks_may_only_lower_it(tmp_path: Path) -> None:
    svc = _service(tmp_path, disk_limit="64m")
    try:
        spec = svc._runtime_spec(PrepareParams(spec=EvaluatorSpec("command", {"command": ["true"]})))
        assert spec.disk_limit == "64m"
        lower = EvaluatorSpec("command", {"command": ["true"], "runtime": {"disk_limit": "16m"}})
        assert svc._runtime_spec(PrepareParams(spec=lower)).disk_limit == "16m"
        higher = EvaluatorSpec("command", {"command": ["true"], "runtime": {"disk_limit": "1g"}})
        with pytest.raises(InvalidArgument) as info:
            await svc.prepare(PrepareParams(spec=higher))
        assert info.value.details["field"] == "disk_limit"
    finally:
        await svc.close()
    unlimited = _service(tmp_path, disk_limit="")
    spec = unlimited._runtime_spec(PrepareParams(spec=EvaluatorSpec("command", {"command": ["true"]})))
    assert spec.disk_limit is None
