"""Agent failures told apart from the policy's: harness exit codes, failures before the first call, outages."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import stat
from pathlib import Path, PurePosixPath

import pytest

from gateway.agent_failures import agent_failure
from gateway.app import harness_bin_dir
from gateway.core import SessionPipeline
from gateway.dependencies import PROXY, DependencyMonitor, Outage
from gateway.errors import GatewayBusy
from gateway.harness_check import check_program
from gateway.harnesses import HarnessLaunch
from gateway.models import AgentRun, EvaluatorConfig, HarnessConfig, PipelineConfig, SessionSpec
from gateway.settings import GatewaySettings
from gateway.testing import (
    FakeAgentRunner,
    FakeEvaluator,
    FakeProxy,
    FakeReconstructor,
    FakeRuntimeFactory,
    RecordingSink,
)
from polar_core.errors import FailedPrecondition, Unavailable
from polar_core.records import AgentStatus, CompletionRecord, TerminalStatus


@dataclasses.dataclass
class SwitchProbe:
    """A health probe whose answer the test sets."""

    up: bool = True
    checks: int = 0

    async def healthy(self, *, timeout_s: float) -> bool:
        self.checks += 1
        return self.up


@dataclasses.dataclass
class CrashingAgents(FakeAgentRunner):
    """A harness that exits with ``code`` and a message on stderr before calling the model."""

    code: int = 3

    async def run(self, runtime: object, prepared: object, *, timeout_s: float) -> AgentRun:  # type: ignore[override]
        return AgentRun(AgentStatus.ERROR, exit_code=self.code, stderr="boot\nerror: cannot load config.json\n")


@dataclasses.dataclass
class OutageAgents(FakeAgentRunner):
    """A harness during whose run the proxy goes down (the monitor sees it) and whose calls then fail."""

    monitor: DependencyMonitor | None = None
    probe: SwitchProbe | None = None

    async def run(self, runtime: object, prepared: object, *, timeout_s: float) -> AgentRun:  # type: ignore[override]
        assert self.monitor is not None
        assert self.probe is not None
        self.proxy.record_call(runtime.session_id)  # type: ignore[attr-defined]
        self.probe.up = False
        await self.monitor.probe_once()
        self.probe.up = True
        await self.monitor.probe_once()
        return AgentRun(AgentStatus.ERROR, exit_code=1, stderr="fetch failed: ECONNREFUSED")


def make_spec(session_id: str = "s1") -> SessionSpec:
    return SessionSpec(
        session_id=session_id,
        task_id="t1",
        harness=HarnessConfig("fake"),
        instruction="fix it",
        evaluator=EvaluatorConfig("script", {}),
    )


def pipeline(agents: FakeAgentRunner, proxy: FakeProxy, monitor: DependencyMonitor | None = None) -> SessionPipeline:
    return SessionPipeline(
        PipelineConfig(step_retries=0),
        gateway_id="gw",
        runtimes=FakeRuntimeFactory(),
        agents=agents,
        proxy=proxy,
        reconstructor=FakeReconstructor(),
        evaluator=FakeEvaluator(),
        sink=RecordingSink(),
        dependencies=monitor,
    )


def record(ended_at: float) -> CompletionRecord:
    return CompletionRecord("s", "c", 0, [1], [2], [-0.1], started_at=ended_at, ended_at=ended_at)


def test_classification() -> None:
    crashed = AgentRun(AgentStatus.ERROR, exit_code=3, stderr="x" * 2000 + "the end")
    failure = agent_failure(crashed, [], None)
    assert failure is not None
    assert not failure.dependency_unavailable
    assert "code 3 before its first model call" in failure.message
    assert failure.message.endswith("the end")
    assert len(failure.message) < 1000
    # After a model call a non-zero exit is the policy's business (scored), as is a clean exit without calls.
    assert agent_failure(crashed, [record(1.0)], None) is None
    assert agent_failure(AgentRun(AgentStatus.COMPLETED), [], None) is None
    # A proxy outage during RUN spoils it, unless the harness finished cleanly with a call served after it began.
    outage = Outage(10.0, 20.0)
    spoilt = agent_failure(AgentRun(AgentStatus.COMPLETED), [record(5.0)], outage)
    assert spoilt is not None
    assert spoilt.dependency_unavailable
    assert agent_failure(AgentRun(AgentStatus.COMPLETED), [record(25.0)], outage) is None
    assert agent_failure(AgentRun(AgentStatus.COMPLETED), [record(5.0), record(12.0)], Outage(10.0)) is None
    assert agent_failure(AgentRun(AgentStatus.ERROR, exit_code=1), [record(25.0)], outage) is not None


async def test_harness_exiting_before_its_first_call_is_infra_error_with_code_and_stderr() -> None:
    proxy = FakeProxy()
    gateway = pipeline(CrashingAgents(proxy), proxy)
    await gateway.start_session(make_spec())
    result = await gateway.wait_done("s1")
    assert result.status is TerminalStatus.INFRA_ERROR
    assert result.harness_exit_code == 3
    assert not result.dependency_unavailable
    assert "exited with code 3" in result.error_message
    assert "cannot load config.json" in result.error_message


async def test_every_result_carries_the_exit_code() -> None:
    proxy = FakeProxy()
    gateway = pipeline(FakeAgentRunner(proxy, exit_code=5), proxy)
    await gateway.start_session(make_spec())
    result = await gateway.wait_done("s1")
    assert result.status is TerminalStatus.RESOLVED
    assert result.harness_exit_code == 5


async def test_outage_during_run_is_infra_error_marked_as_outage() -> None:
    proxy, probe = FakeProxy(), SwitchProbe()
    monitor = DependencyMonitor({PROXY: probe}, failures_to_down=1)
    gateway = pipeline(OutageAgents(proxy, monitor=monitor, probe=probe), proxy, monitor)
    await gateway.start_session(make_spec())
    result = await gateway.wait_done("s1")
    assert result.status is TerminalStatus.INFRA_ERROR
    assert result.dependency_unavailable
    assert "proxy was unreachable" in result.error_message
    assert "ECONNREFUSED" in result.error_message
    assert result.completions == 1  # the captured call is kept


async def test_unreachable_dependency_means_no_capacity_and_refused_admission() -> None:
    proxy, probe = FakeProxy(), SwitchProbe(up=False)
    monitor = DependencyMonitor({"evaluator": probe})
    gateway = pipeline(FakeAgentRunner(proxy), proxy, monitor)
    await monitor.probe_once()  # one missed probe is not an outage yet (a busy host)
    assert monitor.unavailable() == []
    await monitor.probe_once()
    assert monitor.unavailable() == ["evaluator"]
    assert gateway.capacity().available == 0
    with pytest.raises(GatewayBusy, match="evaluator") as refused:
        await gateway.start_session(make_spec())
    assert refused.value.retry_after_s is not None
    assert refused.value.retry_after_s <= 2.0
    probe.up = True
    await monitor.probe_once()
    assert gateway.capacity().available > 0
    await gateway.start_session(make_spec())
    assert (await gateway.wait_done("s1")).status is TerminalStatus.RESOLVED


async def test_unavailable_step_marks_the_result_as_outage() -> None:
    class DownProxy(FakeProxy):
        async def open_session(self, spec: SessionSpec, model: str, *, timeout_s: float) -> object:  # type: ignore[override]
            raise Unavailable("proxy down")

    proxy = DownProxy()
    gateway = pipeline(FakeAgentRunner(proxy), proxy)
    await gateway.start_session(make_spec())
    result = await gateway.wait_done("s1")
    assert result.status is TerminalStatus.INFRA_ERROR
    assert result.dependency_unavailable
    assert result.harness_exit_code is None


async def test_monitor_probes_in_the_background() -> None:
    probe = SwitchProbe()
    monitor = DependencyMonitor({PROXY: probe}, interval_s=0.01)
    monitor.start()
    try:
        for _ in range(500):
            if probe.checks >= 3:
                break
            await asyncio.sleep(0.01)
    finally:
        await monitor.stop()
    assert probe.checks >= 3
    assert monitor.unavailable() == []


def test_missing_program_is_refused_naming_it(tmp_path: Path) -> None:
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    root = PurePosixPath("/check")
    launch = HarnessLaunch(argv=("pi-not-installed", "--x"), env=env, cwd=root / "workspace")
    with pytest.raises(FailedPrecondition, match=r"'pi-not-installed'.*setup_harnesses\.sh") as refused:
        check_program("pi", launch, session_root=root)
    assert refused.value.details["cli"] == "pi-not-installed"
    cli = tmp_path / "pi-not-installed"
    cli.write_text("#!/bin/sh\n")
    cli.chmod(cli.stat().st_mode | stat.S_IXUSR)
    check_program("pi", launch, session_root=root)
    with pytest.raises(FailedPrecondition):
        check_program("command", dataclasses.replace(launch, argv=("/nonexistent/agent",)), session_root=root)
    # Programs in the session's own workspace cannot be checked before it exists.
    check_program("command", dataclasses.replace(launch, argv=(str(root / "workspace/run.sh"),)), session_root=root)
    assert os.access(cli, os.X_OK)


def test_harness_bin_dir_defaults_to_the_installed_clis(tmp_path: Path) -> None:
    installed = tmp_path / ".harnesses" / "node_modules" / ".bin"
    installed.mkdir(parents=True)
    assert harness_bin_dir(GatewaySettings(), cwd=tmp_path) == installed.resolve()
    assert harness_bin_dir(GatewaySettings(harness_bin_dir="/opt/clis"), cwd=tmp_path) == Path("/opt/clis")
