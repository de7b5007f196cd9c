"""Unit tests of the gVisor runtime's wiring: no runsc is started (integration_tests/test_runtime_gvisor.py does)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from polar_core.errors import InvalidArgument
from runtimes import (
    Isolation,
    IsolationUnavailable,
    NetworkMode,
    OperatorPolicy,
    RuntimeSpec,
    apply_task_runtime,
    gvisor,
)
from runtimes.factory import create_runtime
from runtimes.gvisor import GVisorRuntime
from runtimes.local import LocalRuntime, probe_isolation


def test_gvisor_ranks_above_bwrap() -> None:
    assert Isolation.GVISOR.rank > Isolation.BWRAP.rank > Isolation.UNSHARE.rank
    with pytest.raises(InvalidArgument, match="weaker than the minimum 'gvisor'"):
        RuntimeSpec(isolation=Isolation.BWRAP, min_isolation=Isolation.GVISOR)


@pytest.mark.parametrize(
    ("isolation", "minimum", "kind"),
    [
        (Isolation.GVISOR, Isolation.NONE, GVisorRuntime),
        (Isolation.AUTO, Isolation.GVISOR, GVisorRuntime),
        (Isolation.AUTO, Isolation.BWRAP, LocalRuntime),
        (Isolation.BWRAP, Isolation.NONE, LocalRuntime),
    ],
)
def test_create_runtime_picks_gvisor_only_when_asked(
    tmp_path: Path, isolation: Isolation, minimum: Isolation, kind: type
) -> None:
    spec = RuntimeSpec(isolation=isolation, min_isolation=minimum)
    assert isinstance(create_runtime(spec, session_id="s", base_dir=tmp_path), kind)


def test_a_task_may_ask_for_gvisor_but_not_below_an_operators_gvisor() -> None:
    spec = apply_task_runtime(OperatorPolicy(), {}, {"isolation": "gvisor"})
    assert spec.isolation is Isolation.GVISOR
    with pytest.raises(InvalidArgument, match="at least 'gvisor'"):
        apply_task_runtime(OperatorPolicy(min_isolation=Isolation.GVISOR), {}, {"isolation": "bwrap"})


async def test_missing_runsc_fails_closed_with_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("runtimes.gvisor.shutil.which", lambda *a, **k: None)
    runtime = GVisorRuntime(RuntimeSpec(isolation=Isolation.GVISOR), session_id="s", base_dir=tmp_path)
    with pytest.raises(IsolationUnavailable, match=r"isolation 'gvisor' is not available here: gVisor \(runsc\)"):
        await runtime.start()
    probe = await probe_isolation(Isolation.GVISOR)
    assert probe.best is not Isolation.GVISOR
    assert "runsc" in (probe.shortfall(Isolation.GVISOR) or "")


async def test_local_runtime_never_runs_gvisor_itself(tmp_path: Path) -> None:
    runtime = LocalRuntime(RuntimeSpec(isolation=Isolation.GVISOR), session_id="s", base_dir=tmp_path)
    with pytest.raises(IsolationUnavailable, match="GVisorRuntime"):
        await runtime.start()


def test_bundle_shows_the_session_read_write_and_the_system_read_only(tmp_path: Path) -> None:
    sock = tmp_path / "proxy.sock"
    sock.touch()
    spec = RuntimeSpec(isolation=Isolation.GVISOR, network=NetworkMode.PROXY, proxy_socket=sock, tmp_size="32m")
    runtime = GVisorRuntime(spec, session_id="s", base_dir=tmp_path / "sessions")
    runtime.host_root.mkdir(parents=True)
    runtime._write_bundle()
    bundle = tmp_path / "sessions" / ".polar-gvisor" / runtime.sandbox_id / "bundle"
    config = json.loads((bundle / "config.json").read_text())
    assert config["root"] == {"path": "rootfs", "readonly": True}
    assert config["hostname"] == "polar-sandbox"
    assert all(not v for v in config["process"]["capabilities"].values())
    assert config["process"]["noNewPrivileges"] is True
    mounts = {m["destination"]: m for m in config["mounts"]}
    assert mounts["/polar/session"]["source"] == str(runtime.host_root)
    assert "rw" in mounts["/polar/session"]["options"]
    assert "ro" in mounts["/usr"]["options"]
    assert mounts["/run/polar/proxy.sock"]["source"] == str(sock)
    assert f"size={32 * 1024**2}" in mounts["/tmp"]["options"]
    assert (bundle / "rootfs" / "etc" / "passwd").read_text().count("\n") <= 3  # never the host's users
    assert (bundle / "rootfs" / ".polar" / "reaper.py").is_file()
    assert "/etc/shadow" not in mounts


def test_commands_run_with_limits_reaper_and_tunnel_inside(tmp_path: Path) -> None:
    sock = tmp_path / "proxy.sock"
    spec = RuntimeSpec(isolation=Isolation.GVISOR, network=NetworkMode.PROXY, proxy_socket=sock, proxy_port=18999,
                       memory_limit="256m", pids_limit=64)  # fmt: skip
    runtime = GVisorRuntime(spec, session_id="s", base_dir=tmp_path)
    argv = runtime.wrap_argv(["echo", "hi"], cwd=runtime.root, env={"A": "1"}, timeout=7)
    assert argv[0] == "runsc"
    assert "--network=none" in argv
    assert "--host-uds=open" in argv
    assert f"--platform={gvisor.PLATFORM}" in argv
    exec_at = argv.index("exec")
    assert argv[exec_at + 1 : exec_at + 3] == ["--user", "65534:65534"] or not argv[exec_at + 2].startswith("0:")
    assert "A=1" in argv
    assert f"--as={256 * 1024**2}" in argv
    assert "--nproc=64" in argv
    reaper = argv.index("/.polar/reaper.py")
    assert argv[reaper - 1] == sys.executable
    assert argv[reaper + 1] == "7.000"
    assert "--listen" in argv[reaper:]
    assert argv[-2:] == ["echo", "hi"]
