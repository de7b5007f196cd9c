"""One trace per session, end to end: SubmitTask → rollout dispatch → gateway stages → proxy calls → scoring.

Rollout server, gateway, model proxy (scripted backend), reconstructor and evaluator run in this process, each
with its own tracer provider exporting over OTLP to a test receiver. A trainer submits a one-sample task whose
``command`` harness makes two proxy calls through the gateway's tunnel. The session's spans must all be in the
trace SubmitTask's client span started, with these parent links::

    trainer SubmitTask (client) → rollout SubmitTask (server) → rollout StartSession (client)
      → gateway StartSession (server) → gateway.init / .ready / .running / .postrun
    gateway.init → OpenSession (client) → proxy OpenSession (server) → both proxy call spans (gen_ai.*)
    gateway.postrun → Reconstruct (client → reconstructor server), Evaluate (client → evaluator server)
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from polar.common.v1 import status_pb2, task_pb2
from polar.rollout.v1 import rollout_service_pb2 as pb
from polar.rollout.v1 import rollout_service_pb2_grpc

from gateway.server import start_server as start_gateway
from gateway.settings import GatewaySettings
from integration_tests.otlp import OtlpReceiver, ReceivedSpan
from model_proxy.app import ProxyApp
from model_proxy.backends.scripted import ScriptedBackend, ScriptTurn
from model_proxy.servicer import registration
from model_proxy.settings import ProxySettings
from polar_core.channels import open_channel
from polar_core.model_fixtures import build_tiny_tokenizer
from polar_core.server import start_grpc_server
from polar_run.serve import service_spec
from rollout_server.server import start_server as start_rollout_server
from rollout_server.settings import RolloutSettings

pytestmark = [
    pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for the workspace"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

# OTLP span kinds.
SERVER, CLIENT = 2, 3
SUBMIT = "/polar.rollout.v1.RolloutService/SubmitTask"
START = "/polar.gateway.v1.GatewayService/StartSession"
OPEN = "/polar.proxy.v1.ModelProxyService/OpenSession"
RECONSTRUCT = "/polar.reconstructor.v1.ReconstructorService/ReconstructStream"
EVALUATE = "/polar.evaluator.v1.EvaluatorService/Evaluate"
STAGES = ("gateway.init", "gateway.ready", "gateway.running", "gateway.postrun")

AGENT = """
import json, os, urllib.request
messages = []
for i in range(2):
    messages.append({"role": "user", "content": f"step {i}"})
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"model": os.environ["POLAR_MODEL"], "messages": messages}).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
    )
    messages.append(json.loads(urllib.request.urlopen(request, timeout=60).read())["choices"][0]["message"])
"""


def _provider(service: str, port: int) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"127.0.0.1:{port}", insecure=True)))
    return provider


class Trace:
    def __init__(self, spans: list[ReceivedSpan]) -> None:
        self.spans = spans
        self.by_id = {s.span_id: s for s in spans}

    def all(self, service: str, name: str | Callable[[str], bool], kind: int | None = None) -> list[ReceivedSpan]:
        def named(s: ReceivedSpan) -> bool:
            return name(s.name) if callable(name) else s.name == name

        return [s for s in self.spans if s.service == service and named(s) and (kind is None or s.kind == kind)]

    def one(self, service: str, name: str, kind: int | None = None) -> ReceivedSpan:
        found = self.all(service, name, kind)
        assert len(found) == 1, (service, name, kind, [(s.service, s.name) for s in self.spans])
        return found[0]

    def parent(self, span: ReceivedSpan) -> ReceivedSpan:
        assert span.parent_span_id in self.by_id, f"{span.service} {span.name} has no parent in the trace"
        return self.by_id[span.parent_span_id]


async def test_one_trace_per_session_from_submit_to_evaluation(otlp_receiver: OtlpReceiver, tmp_path: Path) -> None:
    port = otlp_receiver.port
    names = ("trainer", "polar-rollout", "polar-gateway", "polar-proxy", "polar-reconstructor", "polar-evaluator")
    trainer, rollout_tp, gateway_tp, proxy_tp, recon_tp, eval_tp = (_provider(n, port) for n in names)
    tokenizer: Any = build_tiny_tokenizer()
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    turns = [ScriptTurn.from_dict({"text": f"Answer {i}."}) for i in range(2)]
    app = ProxyApp(
        ProxySettings(state_dir=tmp_path / "proxy", fsync=False, context_length=32768),
        ScriptedBackend(turns, tokenizer, end_of_turn_id=eot),
        tokenizer,
        tracer_provider=proxy_tp,
    )
    await app.start()
    proxy_server, proxy_port = await start_grpc_server(
        [registration(app)], host="127.0.0.1", port=0, tracer_provider=proxy_tp
    )
    recon, evaluator = service_spec("reconstructor"), service_spec("evaluator")
    recon_server, recon_port = await recon.start(recon.settings_cls.load(state_dir=tmp_path / "r"), recon_tp)
    eval_server, eval_port = await evaluator.start(evaluator.settings_cls.load(state_dir=tmp_path / "e"), eval_tp)
    rollout = await start_rollout_server(
        RolloutSettings(state_dir=tmp_path / "rollout", heartbeat_interval_s=0.5, dispatch_interval_s=0.05),
        tracer_provider=rollout_tp,
    )
    gateway = await start_gateway(
        GatewaySettings(
            state_dir=tmp_path / "gateway",
            gateway_id="gw-traced",
            proxy_address=f"127.0.0.1:{proxy_port}",
            reconstructor_address=f"127.0.0.1:{recon_port}",
            evaluator_address=f"127.0.0.1:{eval_port}",
            rollout_address=f"127.0.0.1:{rollout.port}",
            metrics_port=-1,
        ),
        tracer_provider=gateway_tp,
    )
    try:
        membership = gateway.app.membership
        assert membership is not None
        async with asyncio.timeout(10):
            await membership.registered.wait()
        task = task_pb2.Task(
            task_id="traced",
            instruction="Answer.",
            num_samples=1,
            timeout_seconds=60,
            harness=task_pb2.HarnessSpec(name="command"),
            runtime=task_pb2.RuntimeSpec(kind=task_pb2.RUNTIME_KIND_LOCAL),
            evaluator=task_pb2.EvaluatorSpec(strategy="session_completed"),
        )
        task.harness.options.update({"argv": ["python3", "-c", AGENT]})
        async with open_channel(f"127.0.0.1:{rollout.port}", tracer_provider=trainer) as channel:
            stub = rollout_service_pb2_grpc.RolloutServiceStub(channel)
            await stub.SubmitTask(pb.SubmitTaskRequest(task=task))
        async with open_channel(f"127.0.0.1:{rollout.port}") as channel:
            stub = rollout_service_pb2_grpc.RolloutServiceStub(channel)
            async with asyncio.timeout(60):
                while True:
                    reply = await stub.GetTask(pb.GetTaskRequest(task_id="traced"))
                    if reply.task.status == status_pb2.TASK_STATUS_COMPLETED:
                        break
                    await asyncio.sleep(0.1)
        assert [r.status for r in reply.session_results] == ["resolved"]
        session_id = reply.session_results[0].session_id

        submit = next(s for s in otlp_receiver.spans if s.service == "trainer" and s.name == SUBMIT)

        def complete(spans: list[ReceivedSpan]) -> bool:
            got = {(s.service, s.name) for s in spans if s.trace_id == submit.trace_id}
            return {("polar-evaluator", EVALUATE), ("polar-gateway", "gateway.postrun")} <= got

        spans = await otlp_receiver.wait_for(complete)
    finally:
        await gateway.stop(None)
        await rollout.stop(None)
        for server in (eval_server, recon_server, proxy_server):
            await server.stop(None)
        await app.close()
        for provider in (trainer, rollout_tp, gateway_tp, proxy_tp, recon_tp, eval_tp):
            provider.shutdown()

    t = Trace([s for s in spans if s.trace_id == submit.trace_id])
    # The trainer's SubmitTask reaches the rollout server, which dispatches the session in the same trace.
    rollout_submit = t.one("polar-rollout", SUBMIT, SERVER)
    assert t.parent(rollout_submit) == submit
    dispatch = t.one("polar-rollout", START, CLIENT)
    assert t.parent(dispatch) == rollout_submit
    start = t.one("polar-gateway", START, SERVER)
    assert t.parent(start) == dispatch
    # One span per stage, children of StartSession.
    stage = {name: t.one("polar-gateway", name) for name in STAGES}
    assert all(t.parent(span) == start for span in stage.values())
    assert {span.attributes["polar.session_id"] for span in stage.values()} == {session_id}
    # INIT opens the proxy session; the proxy parents both of the harness's calls on it.
    open_client = t.one("polar-gateway", OPEN, CLIENT)
    assert t.parent(open_client) == stage["gateway.init"]
    open_server = t.one("polar-proxy", OPEN, SERVER)
    assert t.parent(open_server) == open_client
    calls = t.all("polar-proxy", lambda n: n.startswith("chat "))
    assert len(calls) == 2, [(s.service, s.name) for s in t.spans]
    assert all(t.parent(c) == open_server for c in calls)
    assert all(c.attributes["gen_ai.operation.name"] == "chat" for c in calls)
    assert all(c.attributes["gen_ai.usage.output_tokens"] > 0 for c in calls)
    # POSTRUN reconstructs and evaluates.
    for name, service in ((RECONSTRUCT, "polar-reconstructor"), (EVALUATE, "polar-evaluator")):
        client = t.one("polar-gateway", name, CLIENT)
        assert t.parent(client) == stage["gateway.postrun"]
        assert t.parent(t.one(service, name, SERVER)) == client
    # Nothing of the session leaked into another trace.
    session_spans = [s for s in spans if s.attributes.get("polar.session_id")]
    assert {s.trace_id for s in session_spans} == {submit.trace_id}
