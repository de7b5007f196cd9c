"""Per-gateway tokens: sign, verify, expiry, tampering, and the interceptor's and servicer's use of them."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from polar_core.auth import RoleAuthInterceptor, require_gateway_identity
from polar_core.errors import InvalidArgument, PermissionDenied, Unauthenticated
from polar_core.gateway_tokens import (
    GATEWAY_TOKEN_PREFIX,
    GatewayTokenVerifier,
    is_gateway_token,
    issue_gateway_token,
    load_signing_key,
    new_signing_key,
    parse_ttl,
    read_claims,
)
from polar_core.roles import Role

KEY = b"k" * 40
OTHER_KEY = b"o" * 40
T0 = 1_800_000_000.0


def test_an_issued_token_names_its_gateway_and_verifies_within_its_lifetime() -> None:
    token = issue_gateway_token(KEY, "gw-3", ttl_s=3600, now=T0)
    assert token.startswith(GATEWAY_TOKEN_PREFIX)
    assert is_gateway_token(token)
    assert token.isascii()
    claims = GatewayTokenVerifier(KEY).verify(token, now=T0 + 3599)
    assert (claims.gateway_id, claims.issued_at, claims.expires_at) == ("gw-3", int(T0), int(T0) + 3600)
    assert read_claims(token) == claims
    assert claims.describe() == "gateway gw-3, issued 2027-01-15T08:00:00Z, expires 2027-01-15T09:00:00Z"


def test_an_expired_token_is_refused_saying_when_it_expired() -> None:
    token = issue_gateway_token(KEY, "gw-3", ttl_s=60, now=T0)
    with pytest.raises(Unauthenticated, match=r"gateway token for gw-3 expired at 2027-01-15T08:01:00Z"):
        GatewayTokenVerifier(KEY).verify(token, now=T0 + 60)


def test_a_token_issued_far_in_the_future_is_refused() -> None:
    token = issue_gateway_token(KEY, "gw-3", ttl_s=86400, now=T0 + 3600)
    with pytest.raises(Unauthenticated, match="issued in the future"):
        GatewayTokenVerifier(KEY).verify(token, now=T0)
    GatewayTokenVerifier(KEY).verify(token, now=T0 + 3600 - 60)  # a minute of clock skew is fine


def _reclaim(token: str, **changes: Any) -> str:
    """``token`` with its claims changed and its signature kept."""
    prefix, body, mac = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    claims.update(changes)
    new_body = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{prefix}.{new_body}.{mac}"


@pytest.mark.parametrize("changes", [{"gateway_id": "gw-4"}, {"exp": int(T0) + 10**6}, {"iat": int(T0) - 5}])
def test_a_tampered_token_is_refused(changes: dict[str, Any]) -> None:
    token = issue_gateway_token(KEY, "gw-3", ttl_s=60, now=T0)
    forged = _reclaim(token, **changes)
    assert read_claims(forged) != read_claims(token)
    with pytest.raises(Unauthenticated, match="signature does not match"):
        GatewayTokenVerifier(KEY).verify(forged, now=T0)


def test_a_token_signed_with_another_key_or_with_a_cut_signature_is_refused() -> None:
    token = issue_gateway_token(OTHER_KEY, "gw-3", ttl_s=60, now=T0)
    with pytest.raises(Unauthenticated, match="signature does not match"):
        GatewayTokenVerifier(KEY).verify(token, now=T0)
    good = issue_gateway_token(KEY, "gw-3", ttl_s=60, now=T0)
    for bad in (good[:-4], good + "AA", good.rpartition(".")[0] + ".", good.replace(".", ".x.", 1)):
        with pytest.raises(Unauthenticated):
            GatewayTokenVerifier(KEY).verify(bad, now=T0)


@pytest.mark.parametrize(
    "text", ["", "polar-gw1.", "polar-gw1..Zz9q", "polar-gw1.!!Zz9q.x", "polar-gw1.e30.Zz9q", "Zz9q-bearer"]
)
def test_malformed_tokens_are_refused_without_echoing_them(text: str) -> None:
    with pytest.raises(Unauthenticated) as info:
        GatewayTokenVerifier(KEY).verify(text, now=T0)
    assert "Zz9q" not in info.value.message


def test_keys_ids_and_lifetimes_are_checked(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="at least 32"):
        issue_gateway_token(b"short", "gw-3", ttl_s=60)
    with pytest.raises(InvalidArgument, match="gateway id"):
        issue_gateway_token(KEY, "gw 3", ttl_s=60)
    with pytest.raises(InvalidArgument, match="positive"):
        issue_gateway_token(KEY, "gw-3", ttl_s=0)
    assert [parse_ttl(t) for t in ("90", "90s", "30m", "12h", "7d", "2w", "1.5h")] == [
        90, 90, 1800, 43200, 604800, 1209600, 5400
    ]  # fmt: skip
    for bad in ("", "7y", "-1d", "0"):
        with pytest.raises(InvalidArgument):
            parse_ttl(bad)
    key = tmp_path / "key"
    key.write_text(new_signing_key() + "\n")
    assert len(load_signing_key(key)) == 64
    with pytest.raises(InvalidArgument, match="cannot read"):
        load_signing_key(tmp_path / "missing")


# The interceptor and the servicer's identity check ----------------------------------------------------------


class _Details:
    def __init__(self, method: str, token: str) -> None:
        self.method = method
        self.invocation_metadata = (("authorization", f"Bearer {token}"),) if token else ()


class _Context:
    def __init__(self, token: str) -> None:
        self._metadata = (("authorization", f"Bearer {token}"),)

    def invocation_metadata(self) -> Any:
        return self._metadata

    def auth_context(self) -> dict[str, Any]:
        return {}


def test_the_interceptor_grants_a_valid_gateway_token_the_gateway_role_only() -> None:
    interceptor = RoleAuthInterceptor(
        {"trainer-t": frozenset({Role.TRAINER})}, gateway_tokens=GatewayTokenVerifier(KEY)
    )
    token = issue_gateway_token(KEY, "gw-3", ttl_s=3600)
    assert interceptor._token_roles(_Details("/x/Heartbeat", token)) == (frozenset({Role.GATEWAY}), "")  # type: ignore[arg-type]
    expired = issue_gateway_token(KEY, "gw-3", ttl_s=60, now=time.time() - 3600)
    roles, why = interceptor._token_roles(_Details("/x/Heartbeat", expired))  # type: ignore[arg-type]
    assert roles is None
    assert "expired at" in why
    foreign = issue_gateway_token(OTHER_KEY, "gw-3", ttl_s=3600)
    roles, why = interceptor._token_roles(_Details("/x/Heartbeat", foreign))  # type: ignore[arg-type]
    assert roles is None
    assert "signature does not match" in why
    # A server without the key takes no gateway token, and says so.
    plain = RoleAuthInterceptor({"trainer-t": frozenset({Role.TRAINER})})
    roles, why = plain._token_roles(_Details("/x/Heartbeat", token))  # type: ignore[arg-type]
    assert roles is None
    assert "no gateway_token_key_file" in why


def test_required_gateway_tokens_take_the_gateway_role_from_shared_tokens_but_not_admin() -> None:
    tokens = {
        "shared-gw": frozenset({Role.GATEWAY}),
        "all": frozenset(Role),
        "trainer-t": frozenset({Role.TRAINER}),
    }
    required = RoleAuthInterceptor(tokens, gateway_tokens=GatewayTokenVerifier(KEY, required=True))
    assert required._token_roles(_Details("/x/Heartbeat", "shared-gw")) == (frozenset(), "")  # type: ignore[arg-type]
    assert required._token_roles(_Details("/x/Heartbeat", "all"))[0] == frozenset(Role)  # type: ignore[arg-type]
    optional = RoleAuthInterceptor(tokens, gateway_tokens=GatewayTokenVerifier(KEY))
    assert optional._token_roles(_Details("/x/Heartbeat", "shared-gw"))[0] == frozenset({Role.GATEWAY})  # type: ignore[arg-type]


def test_a_gateway_token_binds_the_call_to_its_gateway_id() -> None:
    token = issue_gateway_token(KEY, "gw-a", ttl_s=3600)
    context: Any = _Context(token)
    require_gateway_identity(context, "gw-a", "Heartbeat")
    with pytest.raises(PermissionDenied, match=r"Heartbeat for gateway 'gw-b' refused: .*token is for gateway 'gw-a'"):
        require_gateway_identity(context, "gw-b", "Heartbeat")
    # Shared tokens bind nothing (the interceptor decided whether they may make gateway calls at all).
    require_gateway_identity(_Context("shared-gw"), "gw-b", "Heartbeat")  # type: ignore[arg-type]


def test_status_codes_of_the_refusals() -> None:
    assert Unauthenticated("x").code_name == grpc.StatusCode.UNAUTHENTICATED.name
    assert PermissionDenied("x").code_name == grpc.StatusCode.PERMISSION_DENIED.name
