from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from polar_core.errors import InvalidArgument
from runtimes import ExecResult, NetworkMode, PathEscapesSession, RuntimeKind, RuntimeSpec, resolve_in_root
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

    async def run_process(argv: list[str], **_: Any) -> ExecResult:
        probed.append(list(argv))
        if "--mount-proc" not in argv and "--proc" not in argv:
            return ExecResult(0, "", "")
        return ExecResult(1, "", "cannot mount proc")  # as in such a container

    monkeypatch.setattr(local, "run_process", run_process)
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    probe = await local.probe_isolation()
    assert probe.best is Isolation.NONE
    if os.geteuid() == 0:  # probed as the sandboxes run: as an unprivileged host id of the sandbox range
        assert all(argv[:2] == ["setpriv", "--reuid=700000000"] for argv in probed)
        probed = [argv[argv.index("--") + 1 :] for argv in probed]
    assert [argv[0] for argv in probed] == ["bwrap", "unshare"]
    assert probe.missing[Isolation.BWRAP] == "bwrap cannot create its sandbox: cannot mount proc"
    assert "'bwrap' is not available here: bwrap cannot create its sandbox" in str(probe.shortfall(Isolation.BWRAP))
    assert probe.shortfall(Isolation.NONE) is None
    spec = RuntimeSpec(kind=RuntimeKind.LOCAL, network=NetworkMode.NONE)
    runtime = local.LocalRuntime(spec, session_id="s", base_dir=tmp_path)
    runtime._isolation = Isolation.UNSHARE
    run = runtime.wrap_argv(["true"], cwd=PurePosixPath("/"), env={})
    run = run[run.index("unshare") :]  # after the resource-limit prefix
    assert set(run[: run.index("--")]) == set(probed[1][: probed[1].index("--")])


def test_sizes_and_limit_options() -> None:
    from runtimes._limits import parse_size

    assert parse_size("4g") == 4 * 1024**3
    assert parse_size("512m") == 512 * 1024**2
    assert parse_size("1GiB") == 1024**3
    assert parse_size(10) == 10
    with pytest.raises(InvalidArgument):
        RuntimeSpec(memory_limit="lots")
    with pytest.raises(InvalidArgument):
        RuntimeSpec(pids_limit=0)
    spec = RuntimeSpec.from_mapping({"cpu_time_limit_s": 60.0, "sandbox_uid": 1000.0, "file_size_limit": "8m"})
    assert spec.cpu_time_limit_s == 60
    assert spec.sandbox_uid == 1000


def test_unenforced_limits_are_named() -> None:
    from runtimes._limits import CgroupPlan, LimitProbe

    bare = LimitProbe(prlimit=True, cgroups=CgroupPlan(), root=True).not_enforced()
    assert any("process count" in line and "root" in line for line in bare)
    assert any("memory" in line for line in bare)
    full = LimitProbe(prlimit=True, cgroups=CgroupPlan(pids=Path("/x"), memory=Path("/y")), root=True).not_enforced()
    assert full == []  # the disk quota's watchdog (runtimes._quota) works on every host


def test_bwrap_command_drops_capabilities_and_hides_etc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import runtimes.local as local
    from runtimes._hostids import HostIdLease
    from runtimes.spec import Isolation

    runtime = local.LocalRuntime(RuntimeSpec(sandbox_uid=4242, sandbox_gid=4343), session_id="s", base_dir=tmp_path)
    runtime._isolation = Isolation.BWRAP
    runtime._disable_userns = True
    runtime._lease = HostIdLease(700000123, tmp_path / "staging")  # as root: a leased host id
    argv = runtime.wrap_argv(["true"], cwd=PurePosixPath("/"), env={})
    bwrap = argv[argv.index("bwrap") :]
    # bubblewrap itself runs as the leased unprivileged host id, which the sandbox's uid maps to.
    setpriv = argv[argv.index("setpriv") : argv.index("bwrap")]
    assert setpriv == ["setpriv", "--reuid=700000123", "--regid=700000123", "--clear-groups", "--"]
    assert bwrap[bwrap.index("--cap-drop") + 1] == "ALL"
    assert bwrap[bwrap.index("--uid") + 1] == "4242"
    assert bwrap[bwrap.index("--gid") + 1] == "4343"
    assert "--disable-userns" in bwrap
    assert "--unshare-user" in bwrap
    targets = [bwrap[i + 2] for i, arg in enumerate(bwrap) if arg == "--ro-bind" and bwrap[i + 2].startswith("/etc")]
    assert "/etc" not in targets  # never the host's whole /etc
    assert "/etc/passwd" in targets
    assert not {"/etc/shadow", "/etc/hostname", "/etc/gitconfig"} & {
        bwrap[i + 1] for i, arg in enumerate(bwrap) if arg == "--ro-bind"
    }
    assert argv[0] in ("prlimit", "sh")


def test_docker_archives_belong_to_the_sandbox_user(tmp_path: Path) -> None:
    import io
    import tarfile

    from runtimes.docker import _dirs_tar, _tar_of

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f.txt").write_text("x")
    for data in (_tar_of(tmp_path / "d", "d", (), (65534, 65534)), _tar_of(b"x", "f", (), (65534, 65534)),
                 _dirs_tar(["session", "session/home"], 65534, 65534)):  # fmt: skip
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            assert {(m.uid, m.gid) for m in tar.getmembers()} == {(65534, 65534)}


async def test_local_runtimes_of_one_factory_probe_bubblewrap_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import runtimes.local as local
    from runtimes import DefaultRuntimeFactory

    probed: list[list[str]] = []

    async def probe(argv: list[str]) -> bool:
        probed.append(list(argv))
        return True

    monkeypatch.setattr(local, "_probe", probe)
    factory = DefaultRuntimeFactory(base_dir=tmp_path)
    first, second = (factory.create(RuntimeSpec(), session_id=s) for s in ("a", "b"))
    assert isinstance(first, local.LocalRuntime)
    assert isinstance(second, local.LocalRuntime)
    assert first._host is second._host  # one probe of this host per factory, no module state
    for runtime in (first, second):
        assert await runtime._host.bwrap_disables_userns()
        assert await runtime._host.bwrap_sizes_tmpfs()
    assert len(probed) == 2
