"""Each of the five real agent CLIs through the real gateway and model proxy: a shell command, then an answer.

A real gateway gRPC server runs each session (StartSession → INIT → READY → RUNNING → POSTRUN → DONE) with the
real harness adapters and runtimes, the real model proxy (scripted backend, tiny ChatML tokenizer) and the real
reconstructor, both over gRPC. Only the evaluator is a seam here: it records the artifacts and the agent's
output, so the test can read the workspace patch the gateway collected and check the CLI's stderr.

The runtime uses the gateway's default network, ``proxy``: loopback only, plus the proxy through the gateway's
Unix-socket tunnel, so any attempt to reach the internet fails inside the sandbox (and a harness that tried
would print a resolver or connection error, which fails the test). Every CLI runs in the local bubblewrap
runtime; Claude Code and pi also run in a Docker container (``--network none`` plus the tunnel) on a private
``dockerd`` with an offline-built image, the host's harness tree mounted read-only.

Skipped when the CLIs are not installed (``scripts/setup_harnesses.sh``) or bubblewrap / dockerd is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import shutil
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from polar.common.v1 import reconstruction_pb2, session_pb2, status_pb2, task_pb2
from polar.gateway.v1 import gateway_service_pb2 as pb
from polar.gateway.v1 import gateway_service_pb2_grpc as pb_grpc

from gateway.app import GatewaySeams
from gateway.models import AgentRun, Artifacts, Evaluation, SessionSpec
from gateway.server import start_server
from gateway.settings import GatewaySettings
from integration_tests.support.harnesses import (
    BIN_DIR,
    MODEL,
    ScriptedProxy,
    assert_tool_loop_mask,
    clis_installed,
    tool_call_turn,
)
from polar_core.channels import open_channel
from polar_core.model_fixtures import build_tiny_tokenizer
from polar_core.records import CompletionRecord, TerminalStatus
from polar_run.serve import service_spec

# The tool's output appears only in the next prompt (never in a sampled span), so it must be masked.
# (No ``$(...)``: Gemini CLI refuses command substitution.)
COMMAND = "echo polar-was-here > out.txt; printf 'tool-output-%s' 42"
TOOL_OUTPUT = "tool-output-42"
ANSWER = "Done: wrote out.txt."
# What a CLI prints when it tries to reach a host it cannot (DNS or connection failures).
NETWORK_ERRORS = re.compile(r"ENOTFOUND|EAI_AGAIN|getaddrinfo|ECONNREFUSED|ENETUNREACH|EHOSTUNREACH|dns error", re.I)

pytestmark = pytest.mark.skipif(
    not clis_installed(), reason="harness CLIs (setup_harnesses.sh) or bubblewrap not installed"
)


@dataclasses.dataclass
class RecordingEvaluator:
    """An evaluator seam that keeps what the gateway sends it and resolves when the patch adds the file."""

    artifacts: list[Artifacts] = dataclasses.field(default_factory=list)
    runs: list[AgentRun] = dataclasses.field(default_factory=list)

    async def prepare(self, spec: SessionSpec, *, request_id: str, timeout_s: float) -> str:
        return request_id

    async def evaluate(self, handle: str, artifacts: Artifacts, run: AgentRun, *, timeout_s: float) -> Evaluation:
        self.artifacts.append(artifacts)
        self.runs.append(run)
        resolved = b"+polar-was-here" in (artifacts.patch or b"")
        return Evaluation(1.0 if resolved else 0.0, TerminalStatus.RESOLVED if resolved else TerminalStatus.UNRESOLVED)

    async def release(self, handle: str, *, timeout_s: float) -> None:
        return None


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tiny_tokenizer()


@dataclasses.dataclass
class Outcome:
    result: Any
    completions: list[CompletionRecord]
    evaluator: RecordingEvaluator

    def describe(self) -> str:
        run = self.evaluator.runs[0] if self.evaluator.runs else None
        out = f"exit {run.exit_code}\nSTDOUT:\n{run.stdout[-2000:]}\nSTDERR:\n{run.stderr[-2000:]}" if run else ""
        requests = [json.dumps(c.request)[:300] for c in self.completions]
        return f"{self.result.status}: {self.result.error_message}\n{out}\nCALLS {len(self.completions)}: {requests}"


async def run_session(
    tmp: Path,
    tokenizer: Any,
    harness: str,
    *,
    options: Mapping[str, Any] | None = None,
    runtime: task_pb2.RuntimeSpec | None = None,
    timeout_s: float = 60.0,
    operator: Mapping[str, Any] | None = None,
) -> Outcome:
    """Start proxy, reconstructor and gateway, run one tool-loop session of ``harness``, stop everything."""
    turns = [tool_call_turn(harness, COMMAND), {"text": ANSWER}]
    evaluator = RecordingEvaluator()
    async with contextlib.AsyncExitStack() as stack:
        proxy = await stack.enter_async_context(ScriptedProxy(turns, tokenizer, tmp / "proxy"))
        recon = service_spec("reconstructor")
        recon_server, recon_port = await recon.start(recon.settings_cls.load(state_dir=tmp / "reconstructor"))
        stack.push_async_callback(recon_server.stop, None)
        settings = GatewaySettings(
            state_dir=tmp / "gateway",
            proxy_address=f"127.0.0.1:{proxy.grpc_port}",
            reconstructor_address=f"127.0.0.1:{recon_port}",
            harness_bin_dir=str(BIN_DIR),
            metrics_port=-1,
            step_timeout_s=60,
            **(operator or {}),
        )
        gateway = await start_server(settings, seams=GatewaySeams(evaluator=evaluator))
        stack.push_async_callback(gateway.stop, None)
        channel = open_channel(f"127.0.0.1:{gateway.port}")
        stack.push_async_callback(channel.close, None)
        spec = _session(harness, options=options, runtime=runtime, timeout_s=timeout_s)
        reply = await _run_to_done(pb_grpc.GatewayServiceStub(channel), spec, timeout_s + 30)
        return Outcome(reply.result, await proxy.list_completions(spec.session_id), evaluator)
    raise AssertionError("unreachable")


def _session(
    harness: str, *, options: Mapping[str, Any] | None, runtime: task_pb2.RuntimeSpec | None, timeout_s: float
) -> session_pb2.SessionSpec:
    task = task_pb2.Task(
        task_id=f"cli-{harness}",
        instruction="Write the file, then say you are done.",
        timeout_seconds=timeout_s,
        harness=task_pb2.HarnessSpec(name=harness),
        runtime=runtime or task_pb2.RuntimeSpec(kind=task_pb2.RUNTIME_KIND_LOCAL),
        evaluator=task_pb2.EvaluatorSpec(strategy="recording"),
        builder=task_pb2.BuilderSpec(strategy=reconstruction_pb2.RECONSTRUCTION_STRATEGY_PREFIX_MERGE),
    )
    task.backend.options.update({"model_name": MODEL})
    if options:
        task.harness.options.update(dict(options))
    return session_pb2.SessionSpec(session_id=f"s-{harness}", task_id=task.task_id, task=task, attempt=1)


async def _run_to_done(stub: Any, spec: session_pb2.SessionSpec, timeout_s: float) -> Any:
    await stub.StartSession(pb.StartSessionRequest(spec=spec))
    async with asyncio.timeout(timeout_s):
        while True:
            reply = await stub.GetSession(pb.GetSessionRequest(session_id=spec.session_id))
            if reply.state.stage == status_pb2.SESSION_STAGE_DONE:
                return reply
            await asyncio.sleep(0.2)


def check_tool_loop(outcome: Outcome, tokenizer: Any) -> None:
    """The assertions every harness must pass."""
    result = outcome.result
    assert result.status == "resolved", outcome.describe()
    run = outcome.evaluator.runs[0]
    assert run.exit_code == 0, outcome.describe()
    assert ANSWER in run.stdout, outcome.describe()
    assert not NETWORK_ERRORS.search(run.stderr + run.stdout), outcome.describe()
    # The file the shell command wrote is in the workspace patch the gateway collected from the runtime.
    assert b"+polar-was-here" in (outcome.evaluator.artifacts[0].patch or b""), outcome.describe()
    assert result.statistics.completions == 2, outcome.describe()
    assert len(outcome.completions) == 2
    # One prefix-merged trace: sampled tool call (mask 1), tool result and the CLI's framing (mask 0), answer (1).
    assert len(result.traces) == 1, outcome.describe()
    trace = result.traces[0]
    first, second = outcome.completions
    masked = assert_tool_loop_mask(trace, first, second)
    text = tokenizer.decode(masked)
    assert TOOL_OUTPUT in text, f"the tool output must sit in the masked span; it holds: {text}"
    sampled_1, interstitial = len(first.response_token_ids), len(masked)
    for sampled in (trace.response_token_ids[:sampled_1], trace.response_token_ids[sampled_1 + interstitial :]):
        assert TOOL_OUTPUT not in tokenizer.decode(list(sampled))


@pytest.mark.parametrize("harness", ["claude-code", "codex", "qwen-code", "gemini-cli", "pi"])
async def test_cli_tool_loop_through_the_gateway(tmp_path: Path, tokenizer: Any, harness: str) -> None:
    options = {"provider_mode": "openai-completions"} if harness == "pi" else None
    outcome = await run_session(tmp_path, tokenizer, harness, options=options)
    check_tool_loop(outcome, tokenizer)
    assert not (tmp_path / "gateway" / "runtimes" / f"s-{harness}").exists(), "the runtime was not removed"


# ---------------------------------------------------------------------------------------------------- docker


@pytest.fixture(scope="module")
def docker_env() -> Iterator[tuple[Any, Any, str]]:
    from integration_tests.support.docker import private_docker

    with private_docker() as env:
        yield env


def _managed_containers(client: Any) -> list[Any]:
    from runtimes.docker import LABEL_MANAGED

    return list(client.containers.list(all=True, filters={"label": f"{LABEL_MANAGED}=true"}))


@pytest.fixture
async def no_container_leaks(docker_env: tuple[Any, Any, str]) -> AsyncIterator[None]:
    _, client, _ = docker_env
    yield
    leaked = [c.name for c in _managed_containers(client)]
    for container in _managed_containers(client):
        container.remove(force=True)
    assert leaked == []


# Claude Code is a native executable; pi runs on the host's ``node``, mounted read-only like the harness tree.
DOCKER_CASES = [("claude-code", [], None), ("pi", ["/usr/bin/node"], {"provider_mode": "anthropic-messages"})]


@pytest.mark.slow
@pytest.mark.usefixtures("no_container_leaks")
@pytest.mark.parametrize(("harness", "mounts", "options"), DOCKER_CASES, ids=[c[0] for c in DOCKER_CASES])
async def test_cli_in_docker_through_the_tunnel(
    tmp_path: Path,
    tokenizer: Any,
    docker_env: tuple[Any, Any, str],
    harness: str,
    mounts: list[str],
    options: dict[str, Any] | None,
) -> None:
    if mounts and shutil.which("node") != mounts[0]:
        pytest.skip(f"needs {mounts} on the host")
    daemon, client, image = docker_env
    seen: list[dict[str, Any]] = []

    async def watch_container() -> None:
        import docker

        from runtimes.docker import LABEL_MANAGED

        # Capture the session container's settings while it runs (it is removed in POSTRUN).
        while not seen:
            # One listing call, then each container's inspection: a container removed in between (another test's
            # teardown, a helper) must not end the watcher, which would then see nothing.
            for summary in client.api.containers(all=True, filters={"label": f"{LABEL_MANAGED}=true"}):
                with contextlib.suppress(docker.errors.NotFound):
                    seen.append(client.api.inspect_container(summary["Id"])["HostConfig"])
            await asyncio.sleep(0.2)

    runtime = task_pb2.RuntimeSpec(kind=task_pb2.RUNTIME_KIND_DOCKER, image=image)
    runtime.options.update({"read_only_paths": mounts})
    # The daemon, the image and the extra mounts are the operator's to allow; the task names them.
    operator = {"docker_host": daemon.url, "allowed_images": [image], "read_only_roots": mounts}
    watcher = asyncio.create_task(watch_container())
    try:
        outcome = await run_session(tmp_path, tokenizer, harness, options=options, runtime=runtime, operator=operator)
    finally:
        watcher.cancel()
    check_tool_loop(outcome, tokenizer)
    assert seen
    assert seen[0]["NetworkMode"] == "none"
    binds: Sequence[str] = seen[0]["Binds"]
    assert any(b.endswith(":/polar/tunnel:ro") for b in binds), binds
    # The whole harness tree (npm CLIs and the Python agents' venvs), read-only.
    assert any(b.startswith(f"{BIN_DIR.parent.parent}:") and b.endswith(":ro") for b in binds), binds
