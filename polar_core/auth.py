"""Control-plane authentication and authorisation: bearer tokens and client certificates grant roles.

A caller's roles come from two places:

- **Its bearer token** (``authorization: Bearer <token>``). A server knows a set of tokens, each granting some
  roles (:meth:`polar_core.settings.ServiceSettings.accepted_tokens`): ``trainer_token`` grants ``trainer``,
  ``gateway_token`` ``gateway``, ``internal_token`` ``internal``, ``admin_token`` ``admin``, and the legacy
  ``auth_token`` every role. When a server knows no token, the token grants every role (embedded stacks).
- **Its client certificate**, under mutual TLS. URI subject alternative names ``polar:role:<role>`` grant that
  role; ``polar:gateway:<id>`` grants ``gateway`` and binds the caller to gateway ``<id>`` (the rollout server
  refuses RegisterGateway, Heartbeat, DrainGateway and ReportSessionResult for any other id). A certificate
  with no ``polar:`` URI grants every role (mTLS then only authenticates, as before roles existed).
- **Its gateway token** (:mod:`polar_core.gateway_tokens`), on a server given the operator's signing key (the
  rollout server's ``gateway_token_key_file``): a signed, expiring ``polar-gw1.`` token grants ``gateway`` and,
  like a ``polar:gateway:<id>`` certificate, binds the caller to the one gateway id it names. A bad one is
  refused with ``UNAUTHENTICATED`` saying why (expired at ..., signature does not match); a good one used for
  another gateway id with ``PERMISSION_DENIED`` naming the token's id. With ``required`` (the rollout server's
  ``require_gateway_tokens``) the shared tokens grant no ``gateway`` role there, unless they grant ``admin``.

The caller holds the roles both grant (the intersection), and may call a method when one of them is listed for
it in :mod:`polar_core.roles`. A missing or unknown token is refused with ``UNAUTHENTICATED``, a known caller
without a listed role with ``PERMISSION_DENIED``; both messages name the method, neither the token.

Health checks and reflection stay open so orchestrators can probe a server without the secret. Tokens are
compared in constant time and never logged.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import grpc

from polar_core.errors import PermissionDenied, Unauthenticated
from polar_core.gateway_tokens import GatewayTokenVerifier, is_gateway_token, read_claims
from polar_core.roles import ALL_ROLES, TOKEN_DIGEST_PREFIX, Role, allowed_roles

__all__ = [
    "AUTH_METADATA_KEY",
    "CERT_GATEWAY_PREFIX",
    "CERT_ROLE_PREFIX",
    "CertificateIdentity",
    "RoleAuthInterceptor",
    "bearer_metadata",
    "certificate_identity",
    "identity_from_uris",
    "require_gateway_identity",
]

AUTH_METADATA_KEY = "authorization"
CERT_ROLE_PREFIX = "polar:role:"
CERT_GATEWAY_PREFIX = "polar:gateway:"
_BEARER = b"Bearer "
_CERT_PREFIX = "polar:"
_OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
_GATEWAY_ONLY = frozenset({Role.GATEWAY})


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """Return call metadata that authenticates with ``token`` (empty when no token is configured)."""
    return ((AUTH_METADATA_KEY, f"Bearer {token}"),) if token else ()


@dataclasses.dataclass(frozen=True, slots=True)
class CertificateIdentity:
    """What a client certificate says about its holder.

    Attributes:
        restricted: Whether the certificate carries ``polar:`` names at all; without them it grants every role
            and binds no gateway id.
        roles: The roles it grants (every role when not ``restricted``).
        gateway_ids: The gateway ids it binds the caller to (``polar:gateway:<id>``).
    """

    restricted: bool = False
    roles: frozenset[Role] = ALL_ROLES
    gateway_ids: frozenset[str] = frozenset()


_UNRESTRICTED = CertificateIdentity()


def identity_from_uris(uris: list[str]) -> CertificateIdentity:
    """The identity of a certificate with these URI subject alternative names."""
    polar = [u for u in uris if u.startswith(_CERT_PREFIX)]
    if not polar:
        return _UNRESTRICTED
    roles: set[Role] = set()
    gateways: set[str] = set()
    for uri in polar:
        if uri.startswith(CERT_ROLE_PREFIX) and uri[len(CERT_ROLE_PREFIX) :] in {r.value for r in Role}:
            roles.add(Role(uri[len(CERT_ROLE_PREFIX) :]))
        elif uri.startswith(CERT_GATEWAY_PREFIX) and uri[len(CERT_GATEWAY_PREFIX) :]:
            roles.add(Role.GATEWAY)
            gateways.add(uri[len(CERT_GATEWAY_PREFIX) :])
    return CertificateIdentity(True, frozenset(roles), frozenset(gateways))


def certificate_identity(context: grpc.aio.ServicerContext[Any, Any]) -> CertificateIdentity:
    """The identity of the caller's client certificate (unrestricted without mTLS)."""
    auth = context.auth_context() or {}
    uris = [v.decode() if isinstance(v, bytes) else str(v) for v in auth.get("peer_uri", [])]
    return identity_from_uris(uris)


def _presented_token(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    """The bearer token of the call ("" when it carries none)."""
    for key, value in context.invocation_metadata() or ():
        if key == AUTH_METADATA_KEY:
            text = value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
            return text[len("Bearer ") :] if text.startswith("Bearer ") else ""
    return ""


def require_gateway_identity(context: grpc.aio.ServicerContext[Any, Any], gateway_id: str, method: str) -> None:
    """Refuse a gateway-scoped call about ``gateway_id`` from a caller bound to another gateway.

    A caller is bound by its client certificate (``polar:gateway:<id>`` names) and by a gateway token
    (:mod:`polar_core.gateway_tokens`, whose signature and lifetime the interceptor has already checked: its
    claims here only narrow what the call may do).

    Raises:
        PermissionDenied: The caller's certificate restricts it and does not name ``gateway_id`` (an ``admin``
            certificate may act for any gateway), or its gateway token is for another gateway id.
    """
    identity = certificate_identity(context)
    if identity.restricted and Role.ADMIN not in identity.roles and gateway_id not in identity.gateway_ids:
        names = ", ".join(sorted(identity.gateway_ids)) or "no gateway id"
        raise PermissionDenied(
            f"{method} for gateway {gateway_id!r} refused: the caller's certificate names {names}",
            details={"gateway_id": gateway_id},
        )
    token = _presented_token(context)
    if not is_gateway_token(token):
        return
    try:
        bound = read_claims(token).gateway_id
    except Unauthenticated as exc:
        raise PermissionDenied(f"{method} for gateway {gateway_id!r} refused: {exc.message}") from None
    if bound != gateway_id:
        raise PermissionDenied(
            f"{method} for gateway {gateway_id!r} refused: the caller's gateway token is for gateway {bound!r}",
            details={"gateway_id": gateway_id, "token_gateway_id": bound},
        )


class RoleAuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Admits a call when the roles of its token (and, under mTLS, its certificate) include one the method allows.

    Args:
        tokens: Every accepted token and the roles it grants; empty means calls need no token.
        mtls: Whether the server requires client certificates, whose ``polar:`` names narrow the roles.
        gateway_tokens: Verifies per-gateway tokens (``polar-gw1.``), which grant ``gateway``; ``None``: this
            server accepts none. With ``gateway_tokens.required`` the tokens above grant no ``gateway`` role
            unless they grant ``admin``.
    """

    def __init__(
        self,
        tokens: Mapping[str, frozenset[Role]],
        *,
        mtls: bool = False,
        gateway_tokens: GatewayTokenVerifier | None = None,
    ) -> None:
        self._tokens = [
            (token.startswith(TOKEN_DIGEST_PREFIX), token.removeprefix(TOKEN_DIGEST_PREFIX).encode(), roles)
            for token, roles in tokens.items()
            if token
        ]
        self._mtls = mtls
        self._gateway_tokens = gateway_tokens
        self._required = gateway_tokens is not None and gateway_tokens.required

    def _token_roles(self, details: grpc.HandlerCallDetails) -> tuple[frozenset[Role] | None, str]:
        """The presented token's roles, or ``None`` and why it is refused.

        Every role when no token is configured (and the call presents no gateway token this server verifies).
        """
        if not self._tokens and self._gateway_tokens is None:
            return ALL_ROLES, ""
        header = b""
        for key, value in details.invocation_metadata or ():
            if key == AUTH_METADATA_KEY:
                header = value.encode() if isinstance(value, str) else value
        presented = header[len(_BEARER) :] if header.startswith(_BEARER) else b""
        if self._gateway_tokens is not None and is_gateway_token(presented):
            try:
                self._gateway_tokens.verify(presented)
            except Unauthenticated as exc:
                return None, exc.message
            return _GATEWAY_ONLY, ""
        if not self._tokens:
            return ALL_ROLES, ""
        if not presented:
            return None, "missing or unknown control-plane token"
        digest = hashlib.sha256(presented).hexdigest().encode()
        roles: set[Role] = set()
        matched = False
        for is_digest, expected, granted in self._tokens:  # every comparison runs: timing says nothing of which
            if hmac.compare_digest(digest if is_digest else presented, expected):
                matched = True
                roles |= granted
        if not matched:
            if is_gateway_token(presented):
                return None, "a gateway token, but this server verifies none (it has no gateway_token_key_file)"
            return None, "missing or unknown control-plane token"
        if self._required and Role.ADMIN not in roles:
            roles.discard(Role.GATEWAY)
        return frozenset(roles), ""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        method = handler_call_details.method or ""
        if method.startswith(_OPEN_PREFIXES):
            return await continuation(handler_call_details)
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        token_roles, refusal = self._token_roles(handler_call_details)
        name = method.lstrip("/")
        if token_roles is None:
            return _deny_like(handler, grpc.StatusCode.UNAUTHENTICATED, f"{name}: {refusal}")
        allowed = allowed_roles(method)
        hint = _REQUIRED_HINT if self._required and Role.GATEWAY in allowed else ""
        if not self._mtls:
            if token_roles & allowed:
                return handler
            return _deny_like(handler, grpc.StatusCode.PERMISSION_DENIED, _denied(name, allowed, token_roles) + hint)
        return _checked_like(handler, lambda context: _check_certificate(context, name, allowed, token_roles, hint))


_REQUIRED_HINT = "; this server takes gateway calls only with a per-gateway token (polar token issue)"


def _denied(name: str, allowed: frozenset[Role], held: frozenset[Role]) -> str:
    wanted = " or ".join(sorted(r.value for r in allowed if r is not Role.ADMIN)) or "admin"
    has = ", ".join(sorted(r.value for r in held)) or "none"
    return f"{name} needs role {wanted}; the caller has role {has}"


def _check_certificate(
    context: grpc.aio.ServicerContext[Any, Any],
    name: str,
    allowed: frozenset[Role],
    token_roles: frozenset[Role],
    hint: str = "",
) -> str | None:
    """The denial message for a call whose certificate leaves it no allowed role, else ``None``."""
    held = token_roles & certificate_identity(context).roles
    return None if held & allowed else _denied(name, allowed, held) + hint


def _handler_kwargs(handler: grpc.RpcMethodHandler[Any, Any]) -> dict[str, Any]:
    return {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }


def _deny_like(
    handler: grpc.RpcMethodHandler[Any, Any], code: grpc.StatusCode, message: str
) -> grpc.RpcMethodHandler[Any, Any]:
    """A denying handler with the same streaming shape and serializers as ``handler``."""

    async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(code, message)

    async def streaming(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(code, message)
        yield None  # pragma: no cover - abort raises

    kwargs = _handler_kwargs(handler)
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(unary, **kwargs)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(unary, **kwargs)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(streaming, **kwargs)
    return grpc.stream_stream_rpc_method_handler(streaming, **kwargs)


def _checked_like(
    handler: grpc.RpcMethodHandler[Any, Any],
    check: Callable[[grpc.aio.ServicerContext[Any, Any]], str | None],
) -> grpc.RpcMethodHandler[Any, Any]:
    """``handler``, run only after ``check(context)`` returns no denial message (else PERMISSION_DENIED)."""

    async def _gate(context: grpc.aio.ServicerContext[Any, Any]) -> None:
        message = check(context)
        if message is not None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, message)

    kwargs = _handler_kwargs(handler)
    if handler.unary_unary is not None:
        inner_uu: Any = handler.unary_unary  # grpc.aio handlers are coroutines; the stubs say plain functions

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await _gate(context)
            return await inner_uu(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, **kwargs)
    if handler.stream_unary is not None:
        inner_su: Any = handler.stream_unary

        async def stream_unary(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await _gate(context)
            return await inner_su(requests, context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, **kwargs)
    inner: Any = handler.unary_stream if handler.unary_stream is not None else handler.stream_stream

    async def streaming(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await _gate(context)
        async for reply in inner(request, context):
            yield reply

    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(streaming, **kwargs)
    return grpc.stream_stream_rpc_method_handler(streaming, **kwargs)
