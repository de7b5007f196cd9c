"""Shared foundation of the Polar services: what every service and client imports.

Modules: :mod:`~polar_core.errors` (the exception hierarchy every service raises; gRPC status codes on the
wire), :mod:`~polar_core.records` (the completion record, the trace and the other records promised to users),
:mod:`~polar_core.settings` (the settings base class), :mod:`~polar_core.server` (gRPC server plumbing:
``RunningService``, ``ServiceApp``), :mod:`~polar_core.rpc_client` and :mod:`~polar_core.grpc_errors` (the
client and server sides of the error mapping), :mod:`~polar_core.channels`, :mod:`~polar_core.auth`,
:mod:`~polar_core.tls`, :mod:`~polar_core.tracing`, :mod:`~polar_core.convert` and
:mod:`~polar_core.durations` (protobuf conversions of the shared records, seconds ↔ ``Duration``),
:mod:`~polar_core.task_paths`, :mod:`~polar_core.registry` (the registry by name every extension point is) and
:mod:`~polar_core.policy_version` (the policy version's one parser and its rule for the initial version).
Only the gRPC-free errors and records are re-exported here, so importing the package loads no gRPC.
"""

from __future__ import annotations

from polar_core.errors import (
    AlreadyExists,
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    PolarError,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Unimplemented,
)
from polar_core.records import (
    AgentStatus,
    CompletionRecord,
    ReconstructionStats,
    ReconstructionStrategy,
    SplitReason,
    TerminalStatus,
    Trace,
    read_jsonl,
    write_jsonl,
)

__all__ = [
    "AgentStatus",
    "AlreadyExists",
    "Cancelled",
    "CompletionRecord",
    "DeadlineExceeded",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "PolarError",
    "ReconstructionStats",
    "ReconstructionStrategy",
    "ResourceExhausted",
    "SplitReason",
    "TerminalStatus",
    "Trace",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "read_jsonl",
    "write_jsonl",
]
