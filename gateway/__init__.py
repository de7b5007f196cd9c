"""The gateway: runs sessions through staged pools (INIT, READY, RUNNING, POSTRUN) behind GatewayService.

See ``docs/gateway.md``. The modules, in the order a session meets them:

* :mod:`gateway.server` serves a :class:`GatewayApp` (:mod:`gateway.app`), which builds everything from
  :class:`GatewaySettings`; :mod:`gateway.servicer` is the thin gRPC layer, converting with :mod:`gateway.convert`.
* :mod:`gateway.core` holds the engine, :class:`SessionPipeline` (plain asyncio, no grpc): admission, the
  stage pools (:mod:`gateway.pools`) and the sessions kept (:mod:`gateway.session`). :mod:`gateway.driver`
  drives each session through its stages, calling collaborators that never call back: side effects are steps
  with time limits and retries (:mod:`gateway.steps`); stage changes, spans, metrics and events are recorded
  by :mod:`gateway.observer`; POSTRUN's work is :mod:`gateway.scoring`; teardown and reporting are
  :mod:`gateway.wrapup`, the verdict and per-trace rewards on the traces :mod:`gateway.rewards`, and what the
  agent did, kept on the result, :mod:`gateway.kept`.
* The pipeline's ports are in :mod:`gateway.ports`; their gRPC implementations in :mod:`gateway.clients`, the
  harness adapters behind :mod:`gateway.agent` (:mod:`gateway.harnesses`), fakes in :mod:`gateway.testing`.
* :mod:`gateway.registration` keeps the gateway in a rollout server's pool; :mod:`gateway.models` holds the
  records.
"""

from __future__ import annotations

from gateway.app import GatewayApp, GatewaySeams
from gateway.core import SessionPipeline
from gateway.models import (
    AgentRun,
    Artifacts,
    Capacity,
    Evaluation,
    ProxyEndpoints,
    Reconstruction,
    SessionArtifacts,
    SessionEvent,
    SessionResult,
    SessionSpec,
    SessionState,
    Stage,
    StageSnapshot,
    TestResult,
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
    "GatewayApp",
    "GatewaySeams",
    "GatewaySettings",
    "ProxyClient",
    "ProxyEndpoints",
    "Reconstruction",
    "ReconstructorClient",
    "ResultSink",
    "RuntimeFactory",
    "SessionArtifacts",
    "SessionEvent",
    "SessionPipeline",
    "SessionResult",
    "SessionSpec",
    "SessionState",
    "Stage",
    "StageSnapshot",
    "TestResult",
]
