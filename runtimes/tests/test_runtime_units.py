from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

from polar_core.errors import InvalidArgument
from runtimes import NetworkMode, PathEscapesSession, RuntimeKind, RuntimeSpec, resolve_in_root
from runtimes.apptainer import build_exec_argv

ROOT = PurePosixPath("/polar/session")


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "repo/../../x", "/polar/sessionx/a", "a\x00b"])
def test_resolve_refuses_escapes(path: str) -> None:
    with pytest.raises(PathEscapesSession):
        resolve_in_root(ROOT, path)


@pytest.mark.parametrize(
    ("path", "expected"),
    [("repo/a.py", "/polar/session/repo/a.py"), ("/polar/session/x/../y", "/polar/session/y"), (".", "/polar/session")],
)
def test_resolve_accepts_paths_inside(path: str, expected: str) -> None:
    assert resolve_in_root(ROOT, path) == PurePosixPath(expected)


def test_escape_is_invalid_argument() -> None:
    assert issubclass(PathEscapesSession, InvalidArgument)


def test_spec_from_mapping() -> None:
    spec = RuntimeSpec.from_mapping({"kind": "docker", "image": "img", "network": "none"}, pids_limit=64)
    assert spec.kind is RuntimeKind.DOCKER
    assert spec.pids_limit == 64
    with pytest.raises(InvalidArgument):
        RuntimeSpec.from_mapping({"kind": "docker"})
    with pytest.raises(InvalidArgument):
        RuntimeSpec.from_mapping({"kind": "local", "bogus": 1})
    with pytest.raises(InvalidArgument):
        RuntimeSpec.from_mapping({"kind": "nope"})


def test_apptainer_argv_isolates_and_binds() -> None:
    spec = RuntimeSpec(kind=RuntimeKind.APPTAINER, image="/images/py.sif")
    argv = build_exec_argv(
        spec,
        host_root=Path("/var/s1"),
        argv=["python3", "-V"],
        cwd=PurePosixPath("/polar/session/repo"),
        env={"HOME": "/polar/session/home"},
    )
    assert argv[:2] == ["apptainer", "exec"]
    assert "--containall" in argv
    assert "--cleanenv" in argv
    assert argv[argv.index("--network") + 1] == "none"
    assert "--net" in argv
    assert argv[argv.index("--bind") + 1] == "/var/s1:/polar/session"
    assert argv[argv.index("--pwd") + 1] == "/polar/session/repo"
    assert argv[argv.index("--env") + 1] == "HOME=/polar/session/home"
    assert argv[-3:] == ["/images/py.sif", "python3", "-V"]


def test_apptainer_argv_host_network_and_proxy_socket() -> None:
    host = RuntimeSpec(kind=RuntimeKind.APPTAINER, image="x.sif", network=NetworkMode.HOST)
    argv = build_exec_argv(host, host_root=Path("/s"), argv=["true"], cwd=PurePosixPath("/polar/session"), env={})
    assert "--network" not in argv
    proxy = RuntimeSpec(
        kind=RuntimeKind.APPTAINER, image="x.sif", network=NetworkMode.PROXY, proxy_socket=Path("/run/p.sock")
    )
    argv = build_exec_argv(proxy, host_root=Path("/s"), argv=["true"], cwd=PurePosixPath("/polar/session"), env={})
    assert "/run/p.sock:/polar/session/.polar/proxy.sock" in argv
    assert argv[argv.index("--network") + 1] == "none"


async def test_isolation_probes_use_the_flags_the_runtime_runs_with(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A container with a masked /proc lets namespaces be made but not /proc be mounted: the probe must see that."""
    import shutil

    import runtimes.local as local
    from runtimes.spec import Isolation

    probed: list[list[str]] = []

    async def probe(argv: list[str]) -> bool:
        probed.append(list(argv))
        return "--mount-proc" not in argv and "--proc" not in argv  # as in such a container

    monkeypatch.setattr(local, "_probe", probe)
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    assert await local.detect_isolation() is Isolation.NONE
    assert [argv[0] for argv in probed] == ["bwrap", "unshare"]
    spec = RuntimeSpec(kind=RuntimeKind.LOCAL, network=NetworkMode.NONE)
    runtime = local.LocalRuntime(spec, session_id="s", base_dir=tmp_path)
    runtime._isolation = Isolation.UNSHARE
    run = runtime.wrap_argv(["true"], cwd=PurePosixPath("/"), env={})
    run = run[run.index("unshare") :]  # after the resource-limit prefix
    assert set(run[: run.index("--")]) == set(probed[1][: probed[1].index("--")])
