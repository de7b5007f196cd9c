"""The rollout server: durable tasks in, sessions scheduled onto gateways, results delivered to trainers.

It serves ``polar.rollout.v1.RolloutService`` (see ``docs/rollout.md``). The domain entry is
:class:`RolloutCore` (plain asyncio, no grpc) with the :class:`~rollout_server.scheduler.Scheduler` and the
:class:`~rollout_server.delivery.Deliverer` around it; its seams are in :mod:`rollout_server.ports`, their gRPC
and HTTP implementations in :mod:`rollout_server.clients`, the store in :mod:`rollout_server.store`, the wiring
in :mod:`rollout_server.app` and :mod:`rollout_server.server`, fakes in :mod:`rollout_server.testing`; policy
lag and the staleness bound in :mod:`rollout_server.staleness`.
"""

from __future__ import annotations

from rollout_server.core import RolloutCore, TaskPage
from rollout_server.errors import (
    DeliveryFailed,
    GatewayBusy,
    GatewayRejected,
    GatewaySessionUnknown,
    GatewayUnreachable,
    StaleAttempt,
)
from rollout_server.models import (
    CallbackTarget,
    CoreConfig,
    DeliveryConfig,
    DeliveryRecord,
    DeliveryState,
    GatewayRecord,
    NewTask,
    ResultRecord,
    SchedulerConfig,
    SessionRecord,
    SessionState,
    StalePolicy,
    TaskRecord,
    TaskState,
)
from rollout_server.ports import (
    CallbackSender,
    CapacityView,
    CurrentPolicyVersion,
    GatewayClient,
    GatewaySessionView,
    SessionDispatch,
)
from rollout_server.settings import RolloutSettings
from rollout_server.staleness import StoreCurrentPolicyVersion
from rollout_server.stats import TaskStatistics, TaskSummary

__all__ = [
    "CallbackSender",
    "CallbackTarget",
    "CapacityView",
    "CoreConfig",
    "CurrentPolicyVersion",
    "DeliveryConfig",
    "DeliveryFailed",
    "DeliveryRecord",
    "DeliveryState",
    "GatewayBusy",
    "GatewayClient",
    "GatewayRecord",
    "GatewayRejected",
    "GatewaySessionUnknown",
    "GatewaySessionView",
    "GatewayUnreachable",
    "NewTask",
    "ResultRecord",
    "RolloutCore",
    "RolloutSettings",
    "SchedulerConfig",
    "SessionDispatch",
    "SessionRecord",
    "SessionState",
    "StaleAttempt",
    "StalePolicy",
    "StoreCurrentPolicyVersion",
    "TaskPage",
    "TaskRecord",
    "TaskState",
    "TaskStatistics",
    "TaskSummary",
]
