"""A real gateway with a real model proxy (scripted backend), reconstructor and evaluator, all on port 0."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from polar.common.v1 import status_pb2
from polar.gateway.v1 import gateway_service_pb2 as pb
from polar.gateway.v1 import gateway_service_pb2_grpc as pb_grpc

from gateway.server import create_server
from gateway.settings import GatewaySettings
from polar_core.channels import open_channel
from polar_core.server import RunningService

__all__ = ["Stack", "gateway_stack", "until_stage"]


@dataclasses.dataclass
class Stack:
    """The running stack: the gateway server, a stub to it, its runtimes directory and every service port."""

    gateway: Any
    stub: Any
    runtimes_dir: Path
    host_ports: list[int]


async def _start_proxy(tmp: Path) -> RunningService[Any]:
    from model_proxy.backends.scripted import ScriptedBackend, ScriptTurn
    from model_proxy.server import start_server
    from model_proxy.settings import ProxySettings
    from polar_core.model_fixtures import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    eot: Any = tokenizer.convert_tokens_to_ids("<|im_end|>")
    turns = [ScriptTurn.from_dict({"text": f"Answer number {i}."}) for i in range(4)]
    backend = ScriptedBackend(turns, tokenizer, end_of_turn_id=eot)
    settings = ProxySettings(state_dir=tmp / "proxy", fsync=False, context_length=32768)
    return await start_server(settings, backend=backend, tokenizer=tokenizer)


@contextlib.asynccontextmanager
async def gateway_stack(tmp_path: Path, **overrides: Any) -> AsyncIterator[Stack]:
    """The four services on port 0 below ``tmp_path``; ``overrides`` are gateway settings."""
    from evaluator.server import start_server as start_evaluator
    from evaluator.settings import EvaluatorSettings
    from reconstructor.server import start_server as start_reconstructor
    from reconstructor.settings import ReconstructorSettings

    proxy = await _start_proxy(tmp_path)
    recon = await start_reconstructor(ReconstructorSettings(state_dir=tmp_path / "r"))
    evaluator = await start_evaluator(EvaluatorSettings(state_dir=tmp_path / "evaluator"))
    proxy_port, recon_port, eval_port = proxy.port, recon.port, evaluator.port
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
        ports = [proxy_port, proxy.app.http_port, recon_port, eval_port, port]
        yield Stack(gateway, pb_grpc.GatewayServiceStub(channel), tmp_path / "gateway" / "runtimes", ports)
    finally:
        await channel.close(None)
        await gateway.stop(None)
        for service in (evaluator, recon, proxy):
            await service.stop(None)


async def until_stage(stub: Any, session_id: str, stage: int, limit_s: float = 60.0) -> Any:
    """Poll GetSession until the session reaches ``stage`` (or ends)."""
    async with asyncio.timeout(limit_s):
        while True:
            reply = await stub.GetSession(pb.GetSessionRequest(session_id=session_id))
            if reply.state.stage == stage or reply.state.stage == status_pb2.SESSION_STAGE_DONE:
                return reply
            await asyncio.sleep(0.05)
