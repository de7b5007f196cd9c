"""A gateway's own token (``identity_token``): it names the gateway id, and a token that cannot work stops it."""

from __future__ import annotations

import time

import pytest

from gateway.app import identity_gateway_id
from gateway.settings import GatewaySettings
from polar_core.errors import InvalidArgument
from polar_core.gateway_tokens import issue_gateway_token

KEY = b"k" * 64


def test_without_a_token_nothing_is_named() -> None:
    assert identity_gateway_id(GatewaySettings(gateway_id="gw-1")) == ""


def test_the_token_names_the_gateway_id_when_none_is_set() -> None:
    token = issue_gateway_token(KEY, "gw-7", ttl_s=3600)
    assert identity_gateway_id(GatewaySettings(identity_token=token)) == "gw-7"
    assert identity_gateway_id(GatewaySettings(identity_token=token, gateway_id="gw-7")) == "gw-7"


def test_a_token_for_another_gateway_an_expired_or_a_malformed_one_is_refused() -> None:
    token = issue_gateway_token(KEY, "gw-7", ttl_s=3600)
    with pytest.raises(InvalidArgument, match="identity_token is for gateway 'gw-7', but gateway_id is 'gw-8'"):
        identity_gateway_id(GatewaySettings(identity_token=token, gateway_id="gw-8"))
    expired = issue_gateway_token(KEY, "gw-7", ttl_s=60, now=time.time() - 3600)
    with pytest.raises(InvalidArgument, match="has expired"):
        identity_gateway_id(GatewaySettings(identity_token=expired))
    with pytest.raises(InvalidArgument, match="malformed"):
        identity_gateway_id(GatewaySettings(identity_token="polar-gw1.nonsense"))
