"""Control-plane roles and, per service, which roles may call each method (the one table of it).

Every caller of a Polar service acts in one or more roles:

- ``trainer``: submits and watches tasks, updates the policy, reads completion records.
- ``gateway``: registers with the rollout server, heartbeats, reports session results; opens and closes
  sessions on its model proxy; calls the reconstructor and the evaluator.
- ``internal``: the services' calls to each other that no gateway or trainer makes: the rollout server to
  gateways (StartSession, ...) and model proxies (SetPolicyVersion, LoadWeights, ...), a proxy registering
  with the rollout server, the reconstructor reading a proxy's records, result callbacks to a trainer.
- ``admin``: the operator; may call every method (``DrainGateway`` of any gateway, for instance).

A token (:mod:`polar_core.settings`) or a client certificate (:mod:`polar_core.auth`) grants roles; the server
interceptor admits a call when one of the caller's roles is listed for the method here. A method missing from
its table is open to ``admin`` only, so a new RPC is closed until someone decides who may call it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

__all__ = [
    "ALL_ROLES",
    "METHOD_ROLES",
    "TOKEN_DIGEST_PREFIX",
    "Role",
    "allowed_roles",
    "split_method",
]


class Role(enum.StrEnum):
    """A control-plane role."""

    TRAINER = "trainer"
    GATEWAY = "gateway"
    INTERNAL = "internal"
    ADMIN = "admin"


ALL_ROLES: frozenset[Role] = frozenset(Role)

TOKEN_DIGEST_PREFIX = "sha256:"
"""A token setting ``sha256:<64 hex digits>`` holds a token's digest: the service accepts that token but cannot
present it, so a host that only verifies a role's token (a gateway, for ``internal``) need not hold it."""

_T = frozenset({Role.TRAINER})
_G = frozenset({Role.GATEWAY})
_I = frozenset({Role.INTERNAL})

_ROLLOUT: Mapping[str, frozenset[Role]] = {
    "SubmitTask": _T,
    "GetTask": _T,
    "ListTasks": _T,
    "WatchTask": _T,
    "CancelTask": _T,
    "UpdatePolicy": _T,
    "GetPolicy": _T | _I,
    # A gateway's own id only, when its certificate names one (rollout_server/servicer.py checks it).
    "RegisterGateway": _G,
    "Heartbeat": _G,
    "DrainGateway": _G,
    # The pool's view, for trainers and launchers (``polar cluster`` presents the admin token).
    "ListGateways": _T,
    "ReportSessionResult": _G,
    "ReportSessionResultStream": _G,
    "RegisterProxy": _I,
}

_GATEWAY: Mapping[str, frozenset[Role]] = {
    "StartSession": _I,
    "GetSession": _I,
    "CancelSession": _I,
    "WatchSessions": _I,
    "GetCapacity": _I,
}

_PROXY: Mapping[str, frozenset[Role]] = {
    "OpenSession": _G,
    "CloseSession": _G,
    # The gateway collects a session's records; the reconstructor and trainers (`polar run --server`) read them.
    "ListCompletions": _G | _I | _T,
    "WatchCompletions": _G | _I | _T,
    "SetPolicyVersion": _I,
    "PauseGeneration": _I,
    "ResumeGeneration": _I,
    "CheckWeights": _I,
    "LoadWeights": _I,
    "GetPolicy": _I | _T,
}

_RECONSTRUCTOR: Mapping[str, frozenset[Role]] = {"Reconstruct": _G | _I, "ReconstructStream": _G | _I}

_EVALUATOR: Mapping[str, frozenset[Role]] = {"Prepare": _G | _I, "Evaluate": _G | _I, "Release": _G | _I}

_TRAINER_CALLBACK: Mapping[str, frozenset[Role]] = {"DeliverSessionResult": _I}

METHOD_ROLES: Mapping[str, Mapping[str, frozenset[Role]]] = {
    "polar.rollout.v1.RolloutService": _ROLLOUT,
    "polar.gateway.v1.GatewayService": _GATEWAY,
    "polar.proxy.v1.ModelProxyService": _PROXY,
    "polar.reconstructor.v1.ReconstructorService": _RECONSTRUCTOR,
    "polar.evaluator.v1.EvaluatorService": _EVALUATOR,
    "polar.rollout.v1.TrainerCallbackService": _TRAINER_CALLBACK,
}


def split_method(full_method: str) -> tuple[str, str]:
    """``/pkg.Service/Method`` → ``("pkg.Service", "Method")`` (empty strings for a malformed name)."""
    service, _, method = full_method.lstrip("/").partition("/")
    return (service, method) if method else ("", "")


def allowed_roles(full_method: str) -> frozenset[Role]:
    """The roles that may call ``full_method`` (``/pkg.Service/Method``); ``admin`` may call every method."""
    service, method = split_method(full_method)
    return METHOD_ROLES.get(service, {}).get(method, frozenset()) | {Role.ADMIN}
