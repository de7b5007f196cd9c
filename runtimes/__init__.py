"""Runtimes: sandboxes with a session directory, in which harnesses run and evaluators score.

See docs/runtimes.md. The seam is :class:`Runtime` (:mod:`runtimes.base`), built from a :class:`RuntimeSpec` by a
:class:`RuntimeFactory`. Implementations: :class:`runtimes.local.LocalRuntime` (bubblewrap),
:class:`runtimes.docker.DockerRuntime`, :class:`runtimes.apptainer.ApptainerRuntime` (unverified), sharing the
spec, session id, cancel and command environment code of ``runtimes._session.SessionRuntime``. Test machinery that
starts a private ``dockerd`` lives in ``integration_tests/support/docker.py``, not here.
"""

from __future__ import annotations

from runtimes.base import ExecResult, Runtime, resolve_in_root
from runtimes.errors import (
    FileTooLarge,
    IsolationUnavailable,
    PathEscapesSession,
    RuntimeCancelled,
    RuntimeDied,
    RuntimeNotStarted,
)
from runtimes.factory import DefaultRuntimeFactory, RuntimeFactory, create_runtime
from runtimes.sandbox_policy import OperatorPolicy, apply_task_runtime
from runtimes.spec import Isolation, NetworkMode, RuntimeKind, RuntimeSpec

__all__ = [
    "DefaultRuntimeFactory",
    "ExecResult",
    "FileTooLarge",
    "Isolation",
    "IsolationUnavailable",
    "NetworkMode",
    "OperatorPolicy",
    "PathEscapesSession",
    "Runtime",
    "RuntimeCancelled",
    "RuntimeDied",
    "RuntimeFactory",
    "RuntimeKind",
    "RuntimeNotStarted",
    "RuntimeSpec",
    "apply_task_runtime",
    "create_runtime",
    "resolve_in_root",
]
