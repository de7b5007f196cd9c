"""Per-gateway tokens: a bearer token that names the one gateway id it may act as, signed by the operator.

Without mTLS, the shared ``gateway_token`` names a role, not a gateway: any holder could register, heartbeat or
report as any gateway id. A *gateway token* binds its holder to one id. It is issued per gateway by the operator
(``polar token issue --gateway-id gw-3 --ttl 7d``) with a signing key that only the operator and the rollout
server hold (the rollout server's ``gateway_token_key_file``), and it expires.

Format (ASCII, safe in an HTTP/2 header)::

    polar-gw1.<base64url(JSON claims)>.<base64url(HMAC-SHA256(key, "polar-gw1." + base64url(JSON claims)))>

The claims are ``{"gateway_id": ..., "iat": <issued at, Unix s>, "exp": <expires at, Unix s>}``. The MAC covers
the version prefix and the encoded claims, so neither the id nor either time can be changed without the key. The
key is the UTF-8 text of the key file, stripped (``polar token key`` writes 64 random hex digits); at least 32
characters.

Verification (:class:`GatewayTokenVerifier`) checks the MAC in constant time, then the times: a token is refused
once ``exp`` is reached, and when it says it was issued more than :data:`CLOCK_SKEW_S` in the future. Each
refusal is a :class:`~polar_core.errors.Unauthenticated` whose message says why (``expired at ...``, ``signature
does not match``) and never contains the token or the key. The server interceptor (:mod:`polar_core.auth`) runs
it; the rollout server's servicer then compares the id in each gateway RPC with the token's
(:func:`polar_core.auth.require_gateway_identity`).

Stdlib only (``hmac``, ``hashlib``, ``base64``, ``json``), no gRPC: the ``polar token`` command and the Ray
launcher use it too.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime
import hashlib
import hmac
import json
import re
import secrets
import time
from pathlib import Path

from polar_core.errors import InvalidArgument, Unauthenticated

__all__ = [
    "CLOCK_SKEW_S",
    "GATEWAY_TOKEN_PREFIX",
    "MIN_KEY_CHARS",
    "GatewayClaims",
    "GatewayTokenVerifier",
    "is_gateway_token",
    "issue_gateway_token",
    "load_signing_key",
    "new_signing_key",
    "parse_ttl",
    "read_claims",
]

GATEWAY_TOKEN_PREFIX = "polar-gw1."
"""Every gateway token starts with this (the format's version); no other token setting may."""

CLOCK_SKEW_S = 300
"""How far in the future a token's issue time may lie (the issuer's clock may run ahead of the server's)."""

MIN_KEY_CHARS = 32
"""The shortest signing key accepted (``polar token key`` writes 64 hex digits: 256 bits)."""

_GATEWAY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")
_TTL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_TTL_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclasses.dataclass(frozen=True, slots=True)
class GatewayClaims:
    """What a gateway token says.

    Attributes:
        gateway_id: The one gateway id its holder may register, heartbeat, drain and report as.
        issued_at: Unix seconds when it was issued.
        expires_at: Unix seconds from which it is refused.
    """

    gateway_id: str
    issued_at: int
    expires_at: int

    def describe(self) -> str:
        """``gateway gw-3, issued 2026-12-04T11:00:00Z, expires 2026-12-11T11:00:00Z`` (for messages and logs)."""
        return f"gateway {self.gateway_id}, issued {_iso(self.issued_at)}, expires {_iso(self.expires_at)}"


def _iso(unix_s: int) -> str:
    return datetime.datetime.fromtimestamp(unix_s, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _check_key(key: bytes) -> bytes:
    if len(key) < MIN_KEY_CHARS:
        raise InvalidArgument(
            f"a gateway token signing key needs at least {MIN_KEY_CHARS} characters, not {len(key)} "
            "(`polar token key --out FILE` writes one)"
        )
    return key


def _mac(key: bytes, signing_input: str) -> bytes:
    return hmac.new(key, signing_input.encode("ascii"), hashlib.sha256).digest()


def new_signing_key() -> str:
    """A fresh signing key: 64 random hex digits (256 bits)."""
    return secrets.token_hex(32)


def load_signing_key(path: Path) -> bytes:
    """The signing key in ``path``: its UTF-8 text, surrounding whitespace stripped.

    Raises:
        InvalidArgument: The file cannot be read, or the key is shorter than :data:`MIN_KEY_CHARS`.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"cannot read the gateway token signing key {path}: {exc}") from None
    try:
        return _check_key(text.strip().encode("utf-8"))
    except InvalidArgument as exc:
        raise InvalidArgument(f"{path}: {exc.message}") from None


def parse_ttl(text: str) -> int:
    """Seconds in a lifetime such as ``3600``, ``90s``, ``30m``, ``12h``, ``7d`` or ``2w``.

    Raises:
        InvalidArgument: Not such a lifetime, or not positive.
    """
    match = _TTL.match(text)
    if match is None:
        raise InvalidArgument(f"ttl {text!r}: give seconds, or a number with s, m, h, d or w (7d)")
    seconds = int(float(match.group(1)) * _TTL_UNITS[match.group(2)])
    if seconds <= 0:
        raise InvalidArgument(f"ttl {text!r} must be positive")
    return seconds


def is_gateway_token(token: str | bytes) -> bool:
    """Whether ``token`` has the gateway token format's prefix (says nothing about its validity)."""
    prefix = GATEWAY_TOKEN_PREFIX if isinstance(token, str) else GATEWAY_TOKEN_PREFIX.encode("ascii")
    return token.startswith(prefix)  # type: ignore[arg-type]


def issue_gateway_token(key: bytes, gateway_id: str, *, ttl_s: int, now: float | None = None) -> str:
    """A token for ``gateway_id``, valid for ``ttl_s`` seconds from ``now`` (default: the current time).

    Raises:
        InvalidArgument: A bad gateway id (letters, digits and ``._:@-``, at most 128), a non-positive
            lifetime, or a key that is too short.
    """
    _check_key(key)
    if not _GATEWAY_ID.match(gateway_id):
        raise InvalidArgument(
            f"gateway id {gateway_id!r}: letters, digits and . _ : @ - only (at most 128), starting with a letter "
            "or digit"
        )
    if ttl_s <= 0:
        raise InvalidArgument(f"a gateway token's lifetime must be positive, not {ttl_s} s")
    issued = int(time.time() if now is None else now)
    claims = {"gateway_id": gateway_id, "iat": issued, "exp": issued + int(ttl_s)}
    body = _b64(json.dumps(claims, separators=(",", ":"), sort_keys=True).encode("utf-8"))
    signing_input = GATEWAY_TOKEN_PREFIX + body
    return f"{signing_input}.{_b64(_mac(key, signing_input))}"


def _split(token: str) -> tuple[str, str, GatewayClaims]:
    """The signing input, the encoded MAC and the claims of a well-formed token.

    Raises:
        Unauthenticated: Not a well-formed gateway token.
    """
    if not token.startswith(GATEWAY_TOKEN_PREFIX):
        raise Unauthenticated("not a gateway token (it does not start with polar-gw1.)")
    signing_input, dot, mac = token.rpartition(".")
    body = signing_input[len(GATEWAY_TOKEN_PREFIX) :]
    if not dot or not body or "." in body or not mac:
        raise Unauthenticated("malformed gateway token (expected polar-gw1.<claims>.<signature>)")
    try:
        raw = json.loads(_unb64(body))
        claims = GatewayClaims(str(raw["gateway_id"]), int(raw["iat"]), int(raw["exp"]))
    except (binascii.Error, ValueError, TypeError, KeyError, UnicodeDecodeError):
        raise Unauthenticated("malformed gateway token: its claims cannot be read") from None
    if not isinstance(raw.get("gateway_id"), str) or not claims.gateway_id:
        raise Unauthenticated("malformed gateway token: it names no gateway id")
    return signing_input, mac, claims


def read_claims(token: str) -> GatewayClaims:
    """The claims of a well-formed gateway token, *without* checking its signature or its times.

    For narrowing only (a gateway checks its own token names its id; the rollout server's servicer binds a call
    to the id of a token its interceptor has already verified): never grant anything on these alone.

    Raises:
        Unauthenticated: Not a well-formed gateway token.
    """
    return _split(token)[2]


class GatewayTokenVerifier:
    """Verifies gateway tokens with the operator's signing key.

    Args:
        key: The signing key (:func:`load_signing_key`).
        required: Whether the server takes gateway calls only with a gateway token (the shared
            ``gateway_token`` then grants no ``gateway`` role there); see :mod:`polar_core.auth`.
    """

    def __init__(self, key: bytes, *, required: bool = False) -> None:
        self._key = _check_key(key)
        self.required = required

    @classmethod
    def from_file(cls, path: Path, *, required: bool = False) -> GatewayTokenVerifier:
        """A verifier with the key in ``path`` (:func:`load_signing_key`)."""
        return cls(load_signing_key(path), required=required)

    def verify(self, token: str | bytes, *, now: float | None = None) -> GatewayClaims:
        """The claims of ``token`` when its signature matches and it is within its lifetime.

        Raises:
            Unauthenticated: Malformed, signed with another key or altered, expired, or issued in the future;
                the message says which (and when, for the times), never the token.
        """
        text = token.decode("ascii", "replace") if isinstance(token, bytes) else token
        signing_input, mac, claims = _split(text)
        try:
            presented = _unb64(mac)
        except (binascii.Error, ValueError):
            presented = b""
        if not hmac.compare_digest(presented, _mac(self._key, signing_input)):
            raise Unauthenticated(
                "gateway token signature does not match: it was altered, or signed with another key than this "
                "server's gateway_token_key_file"
            )
        current = time.time() if now is None else now
        if current >= claims.expires_at:
            raise Unauthenticated(
                f"gateway token for {claims.gateway_id} expired at {_iso(claims.expires_at)} (issued "
                f"{_iso(claims.issued_at)}); issue a new one (polar token issue --gateway-id {claims.gateway_id})"
            )
        if claims.issued_at > current + CLOCK_SKEW_S:
            raise Unauthenticated(
                f"gateway token for {claims.gateway_id} was issued in the future ({_iso(claims.issued_at)}); "
                "check the clocks of the issuing host and the rollout server"
            )
        return claims
