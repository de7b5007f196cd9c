"""A real gateway with a real model proxy (scripted backend), reconstructor and evaluator, all on port 0."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
from polar.common.v1 import status_pb2
from polar.evaluator.v1 import evaluator_service_pb2_grpc
from polar.gateway.v1 import gateway_service_pb2 as pb
from polar.gateway.v1 import gateway_service_pb2_grpc as pb_grpc

from gateway.server import create_server
from gateway.settings import GatewaySettings
from polar_core.channels import open_channel
from polar_core.server import ServiceRegistration, start_grpc_server
from polar_run.serve import service_spec

__all__ = ["Stack", "gateway_stack", "until_stage"]


@dataclasses.dataclass
class Stack:
    """The running stack: the gateway server, a stub to it, its runtimes directory and every service port."""

    gateway: Any
    stub: Any
    runtimes_dir: Path
    host_ports: list[int]


async def _start_evaluator(tmp: Path) -> tuple[grpc.aio.Server, int]:
    if importlib.util.find_spec("evaluator.server") is not None:
        spec = service_spec("evaluator")
        return await spec.start(spec.settings_cls.load(state_dir=tmp / "evaluator"))
    from evaluator.service import EvaluatorService
    from evaluator.servicer import EvaluatorServicer
    from evaluator.settings import EvaluatorSettings

    servicer = EvaluatorServicer(EvaluatorService(EvaluatorSettings(state_dir=tmp / "evaluator")))
    registration = ServiceRegistration(
        "polar.evaluator.v1.EvaluatorService",
        lambda s: evaluator_service_pb2_grpc.add_EvaluatorServiceServicer_to_server(servicer, s),
    )
    return await start_grpc_server([registration], host="127.0.0.1", port=0)


async def _start_proxy(tmp: Path) -> tuple[grpc.aio.Server, int, Any]:
    from model_proxy.app import ProxyApp
    from model_proxy.backends.scripted import ScriptedBackend, ScriptTurn
    from model_proxy.servicer import registration
    from model_proxy.settings import ProxySettings
    from polar_core.model_fixtures import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    eot: Any = tokenizer.convert_tokens_to_ids("<|im_end|>")
    turns = [ScriptTurn.from_dict({"text": f"Answer number {i}."}) for i in range(4)]
    backend = ScriptedBackend(turns, tokenizer, end_of_turn_id=eot)
    app = ProxyApp(ProxySettings(state_dir=tmp / "proxy", fsync=False, context_length=32768), backend, tokenizer)
    await app.start()
    server, port = await start_grpc_server([registration(app)], host="127.0.0.1", port=0)
    return server, port, app


@contextlib.asynccontextmanager
async def gateway_stack(tmp_path: Path, **overrides: Any) -> AsyncIterator[Stack]:
    """The four services on port 0 below ``tmp_path``; ``overrides`` are gateway settings."""
    proxy_server, proxy_port, proxy_app = await _start_proxy(tmp_path)
    reconstructor = service_spec("reconstructor")
    recon_server, recon_port = await reconstructor.start(reconstructor.settings_cls.load(state_dir=tmp_path / "r"))
    eval_server, eval_port = await _start_evaluator(tmp_path)
    settings = GatewaySettings(
        state_dir=tmp_path / "gateway",
        proxy_address=f"127.0.0.1:{proxy_port}",
        reconstructor_address=f"127.0.0.1:{recon_port}",
        evaluator_address=f"127.0.0.1:{eval_port}",
        metrics_port=-1,
        step_timeout_s=30,
        **overrides,
    )
    gateway, port = await create_server(settings)
    channel = open_channel(f"127.0.0.1:{port}")
    try:
        ports = [proxy_port, proxy_app.http_port, recon_port, eval_port, port]
        yield Stack(gateway, pb_grpc.GatewayServiceStub(channel), tmp_path / "gateway" / "runtimes", ports)
    finally:
        await channel.close(None)
        await gateway.stop(None)
        for server in (eval_server, recon_server, proxy_server):
            await server.stop(None)
        await proxy_app.stop()


async def until_stage(stub: Any, session_id: str, stage: int, limit_s: float = 60.0) -> Any:
    """Poll GetSession until the session reaches ``stage`` (or ends)."""
    async with asyncio.timeout(limit_s):
        while True:
            reply = await stub.GetSession(pb.GetSessionRequest(session_id=session_id))
            if reply.state.stage == stage or reply.state.stage == status_pb2.SESSION_STAGE_DONE:
                return reply
            await asyncio.sleep(0.05)
