"""The Ray fleet gives each gateway a token for its own id when it is given the signing key (needs Ray)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.settings import GatewaySettings
from polar_core.gateway_tokens import GatewayTokenVerifier
from polar_run.ray_fleet.placement import NodeView

pytest.importorskip("ray")


def _fleet(settings: GatewaySettings, key: bytes | None) -> object:
    from polar_run.ray_fleet.fleet import RayFleet

    fleet = object.__new__(RayFleet)  # no actors: only the settings each member would be started with
    fleet._settings = settings
    fleet._token_key = key
    fleet._token_ttl_s = 3600
    return fleet


def test_each_member_gets_a_token_for_its_own_gateway_id(tmp_path: Path) -> None:
    key = b"k" * 64
    node = NodeView("node-1", "10.0.0.7", 8.0)
    settings = GatewaySettings(rollout_address="10.0.0.1:50051", state_dir=tmp_path)
    member = _fleet(settings, key)._member_settings("ray-gateway-3", node)  # type: ignore[attr-defined]
    claims = GatewayTokenVerifier(key).verify(member["identity_token"])
    assert claims.gateway_id == member["gateway_id"] == "ray-gateway-3"
    assert claims.expires_at - claims.issued_at == 3600
    plain = _fleet(settings, None)._member_settings("ray-gateway-4", node)  # type: ignore[attr-defined]
    assert plain["identity_token"] == ""
