"""A real gateway with a real model proxy (scripted backend), reconstructor and evaluator, a local runtime and
the generic ``command`` harness running a Python script that calls the proxy's OpenAI chat endpoint.

The runtime uses the gateway's default network, ``proxy``: loopback only, plus the model proxy through the
gateway's Unix-socket tunnel. Covers: a session reaches ``resolved`` with its completions recorded, traces
reconstructed and the evaluation reported, while the harness can reach no other host port (nor the internet);
cancellation mid-RUN tears the runtime down; an agent timeout keeps the captured calls with status
``agent_timeout``; a malformed task is refused by StartSession with INVALID_ARGUMENT. (RESOURCE_EXHAUSTED with
retry info is covered over gRPC in ``test_gateway_service.py``, where POSTRUN's duration can be controlled.)
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from polar.common.v1 import session_pb2, status_pb2, task_pb2
from polar.gateway.v1 import gateway_service_pb2 as pb

from integration_tests.support.egress import accepted, host_address, listener
from integration_tests.support.gateway_stack import Stack, gateway_stack, until_stage

pytestmark = [
    pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for the workspace"),
    pytest.mark.skipif(shutil.which("python3") is None, reason="the agent script needs python3 on PATH"),
]

# The agent: optional connection probes (any that connects fails the run), N chat calls through the proxy,
# then an answer file, then an optional sleep.
AGENT = """
import json, os, socket, sys, time, urllib.request
calls, pause = int(sys.argv[1]), float(sys.argv[2])
assert os.environ["OPENAI_BASE_URL"] == "http://127.0.0.1:18080/v1", os.environ["OPENAI_BASE_URL"]
for target in sys.argv[3:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError:
        continue
    sys.exit(f"reached {target}")
messages = []
for i in range(calls):
    messages.append({"role": "user", "content": f"step {i}"})
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"model": os.environ["POLAR_MODEL"], "messages": messages}).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
    )
    reply = json.loads(urllib.request.urlopen(request, timeout=60).read())
    messages.append(reply["choices"][0]["message"])
    print("call", i, "ok", flush=True)
open("answer.txt", "w").write("42\\n")
time.sleep(pause)
"""


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    async with gateway_stack(tmp_path) as running:
        yield running


def session(
    session_id: str, *, calls: int, pause_s: float, timeout_s: float = 60.0, probes: tuple[str, ...] = ()
) -> session_pb2.SessionSpec:
    task = task_pb2.Task(
        task_id="e2e",
        instruction="Answer.",
        timeout_seconds=timeout_s,
        harness=task_pb2.HarnessSpec(name="command"),
        runtime=task_pb2.RuntimeSpec(kind=task_pb2.RUNTIME_KIND_LOCAL),
        evaluator=task_pb2.EvaluatorSpec(strategy="session_completed"),
    )
    task.harness.options.update({"argv": ["python3", "-c", AGENT, str(calls), str(pause_s), *probes]})
    return session_pb2.SessionSpec(session_id=session_id, task_id="e2e", task=task, attempt=1)


async def test_session_is_resolved_with_traces(stack: Stack) -> None:
    # The harness may reach the proxy only through the tunnel: not the proxy's own ports, not the other services,
    # not the host's own interface address (where a listener bound to that address alone stands for everything
    # beyond this host). A probe that connects makes the agent exit 1 (unresolved).
    lan = host_address()
    beyond = listener(lan)
    probes = (*(f"{host}:{p}" for p in stack.host_ports for host in ("127.0.0.1", lan)),
              f"{lan}:{beyond.getsockname()[1]}")  # fmt: skip
    try:
        await stack.stub.StartSession(pb.StartSessionRequest(spec=session("ok", calls=2, pause_s=0, probes=probes)))
        reply = await until_stage(stack.stub, "ok", status_pb2.SESSION_STAGE_DONE)
        assert accepted(beyond) == 0
    finally:
        beyond.close()
    result = reply.result
    assert result.status == "resolved", result.error_message
    assert result.terminal_status == status_pb2.TERMINAL_STATUS_RESOLVED
    assert result.reward == 1.0
    assert result.statistics.completions == 2
    assert result.statistics.response_tokens > 0
    assert result.statistics.reconstruction.calls == 2
    assert len(result.traces) >= 1
    assert sum(len(t.call_ids) for t in result.traces) == 2
    assert all(t.status == "resolved" for t in result.traces)
    assert all(1 in t.loss_mask for t in result.traces)
    assert not (stack.runtimes_dir / "ok").exists()


async def test_agent_timeout_keeps_captured_calls(stack: Stack) -> None:
    spec = session("slow", calls=1, pause_s=60, timeout_s=3)
    await stack.stub.StartSession(pb.StartSessionRequest(spec=spec))
    reply = await until_stage(stack.stub, "slow", status_pb2.SESSION_STAGE_DONE)
    assert reply.result.status == "agent_timeout"
    assert reply.result.reward == 0.0
    assert reply.result.statistics.completions == 1
    assert len(reply.result.traces) == 1
    assert reply.result.traces[0].status == "agent_timeout"
    assert not (stack.runtimes_dir / "slow").exists()


async def test_cancel_mid_run_tears_down(stack: Stack) -> None:
    await stack.stub.StartSession(pb.StartSessionRequest(spec=session("cx", calls=1, pause_s=60)))
    reply = await until_stage(stack.stub, "cx", status_pb2.SESSION_STAGE_RUNNING)
    assert reply.state.stage == status_pb2.SESSION_STAGE_RUNNING
    assert (stack.runtimes_dir / "cx").exists()
    await asyncio.sleep(1.0)
    assert _processes_of_session("cx")  # the check below sees the agent while it runs
    await stack.stub.CancelSession(pb.CancelSessionRequest(session_id="cx", reason="test"))
    reply = await until_stage(stack.stub, "cx", status_pb2.SESSION_STAGE_DONE, limit_s=20)
    assert reply.result.status == "cancelled"
    assert reply.result.traces == []
    assert not (stack.runtimes_dir / "cx").exists()
    # No process of the agent survives its runtime: none on this host still carries this session's id (the
    # command harness puts it in the agent's environment; other tests' agents, running at the same time on
    # other workers, carry their own).
    assert _processes_of_session("cx") == []


def _processes_of_session(session_id: str) -> list[int]:
    marker = f"POLAR_SESSION_ID={session_id}".encode() + b"\0"
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):
            if marker in environ.read_bytes():
                found.append(int(environ.parent.name))
    return found


@pytest.mark.parametrize(
    ("harness", "options", "runtime", "expected"),
    [
        ("no-such-harness", {}, {}, "unknown harness"),
        ("claude-code", {"bogus_option": True}, {}, "unknown option"),
        ("command", {}, {}, "argv"),
        ("command", {"argv": ["true"]}, {"no_such_key": 1}, "unknown runtime option"),
        ("command", {"argv": ["true"]}, {"network": "internet"}, "invalid runtime option"),
        ("command", {"argv": ["true"]}, {"network": "host"}, "runtime.network = 'host' widens the sandbox"),
        ("command", {"argv": ["true"]}, {"isolation": "none"}, "runtime.isolation = 'none' widens the sandbox"),
        ("command", {"argv": ["true"]}, {"proxy_socket": "/tmp/x.sock"}, "set by the operator"),
    ],
)
async def test_malformed_task_is_refused_at_admission(
    stack: Stack, harness: str, options: dict[str, Any], runtime: dict[str, Any], expected: str
) -> None:
    spec = session("bad", calls=0, pause_s=0)
    spec.task.harness.name = harness
    spec.task.harness.options.Clear()
    spec.task.harness.options.update(options)
    spec.task.runtime.options.update(runtime)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stack.stub.StartSession(pb.StartSessionRequest(spec=spec))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert expected in (caught.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await stack.stub.GetSession(pb.GetSessionRequest(session_id="bad"))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
