"""The gateway: runs sessions through staged pools (INIT, READY, RUNNING, POSTRUN) behind GatewayService.

See ``docs/gateway.md``. The engine is :class:`SessionPipeline` (plain asyncio, no grpc); its seams are in
:mod:`gateway.ports`, their gRPC implementations in :mod:`gateway.clients`, fakes in :mod:`gateway.testing`.
"""

from __future__ import annotations

from gateway.core import Capacity, SessionPipeline
from gateway.models import (
    AgentRun,
    Artifacts,
    Evaluation,
    ProxyEndpoints,
    Reconstruction,
    SessionEvent,
    SessionResult,
    SessionSpec,
    SessionState,
    Stage,
)
from gateway.ports import (
    AgentRunner,
    EvaluatorClient,
    ProxyClient,
    ReconstructorClient,
    ResultSink,
    RuntimeFactory,
)
from gateway.settings import GatewaySettings

__all__ = [
    "AgentRun",
    "AgentRunner",
    "Artifacts",
    "Capacity",
    "Evaluation",
    "EvaluatorClient",
    "GatewaySettings",
    "ProxyClient",
    "ProxyEndpoints",
    "Reconstruction",
    "ReconstructorClient",
    "ResultSink",
    "RuntimeFactory",
    "SessionEvent",
    "SessionPipeline",
    "SessionResult",
    "SessionSpec",
    "SessionState",
    "Stage",
]
