"""Names of per-session host objects (Docker containers, cgroups): unique per runtime, safe, bounded."""

from __future__ import annotations

import re
from pathlib import Path

from runtimes._limits import CgroupPlan, cgroup_name
from runtimes.docker import container_name

_DOCKER_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+")


def test_container_names_are_fresh_for_every_runtime_of_a_session() -> None:
    names = {container_name("django__django-11099-0000") for _ in range(50)}
    assert len(names) == 50
    assert all(n.startswith("polar-django__django-11099-0000-") for n in names)


def test_container_names_keep_to_dockers_charset_and_length() -> None:
    for session_id in ("a/b:c~attempt2", "", "é" * 10, "x" * 500, "../../etc"):
        name = container_name(session_id)
        assert _DOCKER_NAME.fullmatch(name), name
        assert len(name) <= 63, name


def test_cgroup_names_stay_under_their_parent(tmp_path: Path) -> None:
    plan = CgroupPlan(pids=tmp_path / "pids", memory=tmp_path / "memory", v2=False)
    (tmp_path / "pids").mkdir()
    (tmp_path / "memory").mkdir()
    made = plan.create("../../escape/" + "y" * 400, pids_max=10, memory_max=1 << 20)
    made += plan.create("../../escape/" + "y" * 400, pids_max=10, memory_max=1 << 20)
    assert len({p.name for p in made}) == 2  # the same name under each controller, fresh per runtime
    for path in made:
        assert path.parent in (tmp_path / "pids", tmp_path / "memory")
        assert len(path.name) < 100
    assert cgroup_name("s") != cgroup_name("s")
