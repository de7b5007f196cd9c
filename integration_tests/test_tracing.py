"""One trace crosses two services: trainer → reconstructor → model proxy, exported over OTLP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind
from polar.common.v1 import status_pb2
from polar.proxy.v1 import model_proxy_service_pb2 as proxy_pb
from polar.proxy.v1 import model_proxy_service_pb2_grpc as proxy_grpc
from polar.reconstructor.v1 import reconstructor_service_pb2 as recon_pb
from polar.reconstructor.v1 import reconstructor_service_pb2_grpc as recon_grpc

from integration_tests.otlp import OtlpReceiver
from model_proxy.app import ProxyApp
from model_proxy.backends.scripted import ScriptedBackend, ScriptTurn
from model_proxy.servicer import registration
from model_proxy.settings import ProxySettings
from polar_core.channels import open_channel
from polar_core.model_fixtures import build_tiny_tokenizer
from polar_core.server import start_grpc_server
from reconstructor.server import create_server as create_reconstructor
from reconstructor.settings import ReconstructorSettings


def _provider(service: str, port: int) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{port}", insecure=True)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


async def test_one_trace_spans_reconstructor_and_proxy(otlp_receiver: OtlpReceiver, tmp_path: Path) -> None:
    port = otlp_receiver.port
    trainer, recon_tp, proxy_tp = (_provider(s, port) for s in ("trainer", "polar-reconstructor", "polar-proxy"))
    tokenizer: Any = build_tiny_tokenizer()
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    backend = ScriptedBackend([ScriptTurn.from_dict({"text": "hello there"})], tokenizer, end_of_turn_id=eot)
    app = ProxyApp(
        ProxySettings(state_dir=tmp_path / "proxy", fsync=False), backend, tokenizer, tracer_provider=proxy_tp
    )
    await app.start()
    proxy_server, proxy_port = await start_grpc_server(
        [registration(app)], host="127.0.0.1", port=0, tracer_provider=proxy_tp
    )
    recon_server, recon_port = await create_reconstructor(
        ReconstructorSettings(state_dir=tmp_path / "recon"), tracer_provider=recon_tp
    )
    try:
        async with open_channel(f"127.0.0.1:{proxy_port}") as channel:
            opened = await proxy_grpc.ModelProxyServiceStub(channel).OpenSession(
                proxy_pb.OpenSessionRequest(session_id="s1", model="policy")
            )
        async with httpx.AsyncClient() as http:
            reply = await http.post(
                f"{opened.openai_base_url}/chat/completions",
                headers={"Authorization": f"Bearer {opened.session_token}"},
                json={"model": "policy", "messages": [{"role": "user", "content": "hi"}]},
            )
        assert reply.status_code == 200, reply.text

        with trainer.get_tracer("test").start_as_current_span("trainer.reconstruct") as root:
            async with open_channel(f"127.0.0.1:{recon_port}", tracer_provider=trainer) as channel:
                response = await recon_grpc.ReconstructorServiceStub(channel).Reconstruct(
                    recon_pb.ReconstructRequest(
                        proxy=recon_pb.ProxySource(proxy_target=f"127.0.0.1:{proxy_port}", session_id="s1"),
                        task_id="t1",
                        terminal_status=status_pb2.TERMINAL_STATUS_RESOLVED,
                        reward=1.0,
                    ),
                    timeout=10,
                )
        assert len(response.traces) == 1
        trace_id = format(root.get_span_context().trace_id, "032x")

        def complete(spans: list[Any]) -> bool:
            names = {(s.service, s.name) for s in spans if s.trace_id == trace_id}
            return ("polar-proxy", "/polar.proxy.v1.ModelProxyService/ListCompletions") in names

        spans = [s for s in await otlp_receiver.wait_for(complete) if s.trace_id == trace_id]
    finally:
        await recon_server.stop(None)
        await proxy_server.stop(None)
        await app.close()
        for provider in (trainer, recon_tp, proxy_tp):
            provider.shutdown()

    by_id = {s.span_id: s for s in spans}
    recon_server_span = next(
        s for s in spans if s.service == "polar-reconstructor" and s.kind == SpanKind.SERVER.value + 1
    )
    proxy_server_span = next(s for s in spans if s.service == "polar-proxy" and s.name.endswith("/ListCompletions"))
    # The proxy's server span descends from the reconstructor's client call, which descends from the
    # reconstructor's server span, which descends from the trainer's span: one causal chain, one trace.
    chain = []
    span = proxy_server_span
    while span.parent_span_id and span.parent_span_id in by_id:
        span = by_id[span.parent_span_id]
        chain.append((span.service, span.name))
    assert ("polar-reconstructor", recon_server_span.name) in chain
    assert chain[-1] == ("trainer", "trainer.reconstruct")
    assert by_id[proxy_server_span.parent_span_id].service == "polar-reconstructor"
    assert all(s.trace_id == trace_id for s in spans)
