from __future__ import annotations

import hashlib
from typing import ClassVar

import pytest
from polar.evaluator.v1 import evaluator_service_pb2
from polar.gateway.v1 import gateway_service_pb2
from polar.proxy.v1 import model_proxy_service_pb2
from polar.reconstructor.v1 import reconstructor_service_pb2
from polar.rollout.v1 import rollout_service_pb2, trainer_callback_service_pb2
from pydantic_settings import SettingsConfigDict

from polar_core.auth import identity_from_uris
from polar_core.errors import InvalidArgument
from polar_core.roles import ALL_ROLES, METHOD_ROLES, Role, allowed_roles, split_method
from polar_core.settings import ServiceSettings, is_loopback

_FILES = (
    evaluator_service_pb2,
    gateway_service_pb2,
    model_proxy_service_pb2,
    reconstructor_service_pb2,
    rollout_service_pb2,
    trainer_callback_service_pb2,
)


class _Settings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="POLAR_DEMO_", frozen=True, extra="forbid")
    toml_table: ClassVar[str] = "demo"


def test_every_rpc_of_every_service_has_roles_and_nothing_else_does() -> None:
    declared = {
        service.full_name: {m.name for m in service.methods}
        for module in _FILES
        for service in module.DESCRIPTOR.services_by_name.values()
    }
    assert set(METHOD_ROLES) == set(declared)
    for service, methods in declared.items():
        assert set(METHOD_ROLES[service]) == methods, service
        for method in methods:
            assert allowed_roles(f"/{service}/{method}") - {Role.ADMIN}, f"{service}/{method} has no role"


def test_roles_separate_trainers_gateways_and_internal_calls() -> None:
    rollout = "/polar.rollout.v1.RolloutService/"
    assert allowed_roles(rollout + "SubmitTask") == {Role.TRAINER, Role.ADMIN}
    assert allowed_roles(rollout + "ReportSessionResult") == {Role.GATEWAY, Role.ADMIN}
    assert allowed_roles(rollout + "RegisterProxy") == {Role.INTERNAL, Role.ADMIN}
    assert Role.GATEWAY not in allowed_roles("/polar.gateway.v1.GatewayService/StartSession")
    assert Role.GATEWAY not in allowed_roles("/polar.proxy.v1.ModelProxyService/LoadWeights")
    assert Role.TRAINER not in allowed_roles("/polar.proxy.v1.ModelProxyService/OpenSession")
    # An RPC nobody listed (added later) is closed to all but the operator.
    assert allowed_roles(rollout + "SomethingNew") == {Role.ADMIN}
    assert allowed_roles("garbage") == {Role.ADMIN}
    assert split_method("/a.B/C") == ("a.B", "C")


def test_certificate_names_grant_roles_and_bind_gateway_ids() -> None:
    plain = identity_from_uris(["spiffe://example/whatever"])
    assert not plain.restricted
    assert plain.roles == ALL_ROLES
    trainer = identity_from_uris(["polar:role:trainer", "polar:role:nonsense"])
    assert trainer.restricted
    assert trainer.roles == {Role.TRAINER}
    assert not trainer.gateway_ids
    gateway = identity_from_uris(["polar:gateway:gw-1"])
    assert gateway.roles == {Role.GATEWAY}
    assert gateway.gateway_ids == {"gw-1"}
    assert identity_from_uris(["polar:gateway:"]).roles == frozenset()


def test_role_tokens_are_accepted_and_presented_per_role() -> None:
    digest = hashlib.sha256(b"internal-secret").hexdigest()
    s = _Settings(auth_token="all", trainer_token="t", gateway_token="g", internal_token=f"sha256:{digest.upper()}")
    assert s.accepted_tokens() == {
        "all": ALL_ROLES,
        "t": {Role.TRAINER},
        "g": {Role.GATEWAY},
        f"sha256:{digest}": {Role.INTERNAL},
    }
    assert s.presented_token(Role.GATEWAY) == "g"
    assert s.presented_token(Role.TRAINER) == "t"
    with pytest.raises(InvalidArgument, match="digest"):
        s.presented_token(Role.INTERNAL)
    legacy = _Settings(auth_token="all")
    assert legacy.presented_token(Role.INTERNAL) == "all"
    assert _Settings(gateway_token="same", internal_token="same").accepted_tokens() == {
        "same": {Role.GATEWAY, Role.INTERNAL}
    }
    with pytest.raises(InvalidArgument, match="64 hex"):
        _Settings(admin_token="sha256:abc").accepted_tokens()
    assert _Settings().accepted_tokens() == {}


def test_an_unauthenticated_non_loopback_listener_needs_insecure() -> None:
    for host in ("127.0.0.1", "127.0.0.5", "::1", "localhost"):
        assert is_loopback(host)
        _Settings(host=host).check_listen_security()
    for host in ("0.0.0.0", "::", "", "10.1.2.3", "gateway"):
        assert not is_loopback(host)
        with pytest.raises(InvalidArgument, match="POLAR_DEMO_INSECURE"):
            _Settings(host=host).check_listen_security()
    _Settings(host="0.0.0.0", insecure=True).check_listen_security()
    _Settings(host="0.0.0.0", gateway_token="g").check_listen_security()
