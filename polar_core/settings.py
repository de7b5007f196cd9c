"""Typed settings shared by every service: flags > environment (``POLAR_...``) > TOML file > defaults.

Each service subclasses :class:`ServiceSettings` once in its own ``settings.py`` with its environment prefix
(``POLAR_PROXY_``, ...) and TOML table (``[proxy]``). ``main()`` loads settings once and passes them down;
nothing else reads the environment.
"""

from __future__ import annotations

import ipaddress
import tomllib
from pathlib import Path
from typing import Any, ClassVar, Self

from pydantic import Field
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from polar_core.errors import InvalidArgument
from polar_core.limits import DEFAULT_MAX_MESSAGE_BYTES
from polar_core.roles import ALL_ROLES, TOKEN_DIGEST_PREFIX, Role
from polar_core.tls import TlsFiles

__all__ = ["ServiceSettings", "TelemetrySettings", "is_loopback"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (``localhost``, ``127.0.0.0/8``, ``::1``)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


class _TomlTableSource(PydanticBaseSettingsSource):
    """Reads one table of a TOML file (``[proxy]``), plus top-level keys shared by every service."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path | None, table: str) -> None:
        super().__init__(settings_cls)
        self._values: dict[str, Any] = {}
        if path is None:
            return
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise InvalidArgument(f"cannot read settings file {path}: {exc}") from None
        fields = settings_cls.model_fields
        self._values = {k: v for k, v in data.items() if not isinstance(v, dict) and k in fields}
        section = data.get(table, {})
        if not isinstance(section, dict):
            raise InvalidArgument(f"{path}: [{table}] must be a table")
        self._values.update(section)

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._values)


class ServiceSettings(BaseSettings):
    """Settings every service has.

    Attributes:
        host: Interface the gRPC server binds.
        port: gRPC port; 0 picks a free one (tests, embedded mode).
        state_dir: Directory for this service's durable state.
        auth_token: The legacy all-roles control-plane token: accepted for every role, and presented on every
            outgoing call that has no role token of its own. Empty together with the role tokens below means no
            token is required (embedded stacks on loopback).
        trainer_token: Token accepted for the ``trainer`` role (SubmitTask, GetTask, UpdatePolicy, ...).
        gateway_token: Token accepted for the ``gateway`` role (RegisterGateway, ReportSessionResult,
            OpenSession, Reconstruct, Evaluate, ...) and presented by a gateway.
        internal_token: Token accepted for the ``internal`` role (the rollout server's calls to gateways and
            proxies, a proxy's RegisterProxy, the reconstructor's ListCompletions) and presented by the rollout
            server, proxies and reconstructors.
        admin_token: Token accepted for the ``admin`` role, which may call every method; never presented.
            Any token setting may be ``sha256:<hex digest of the token>``: accepted, never presented.
        insecure: Allow listening on a non-loopback address with neither a token nor mTLS (``--insecure``);
            without it such a service refuses to start.
        tls_cert_file: This server's PEM certificate; with the key and CA below it turns on mutual TLS.
        tls_key_file: This server's PEM private key.
        tls_ca_file: PEM CA that must have signed every client's certificate (clients present one).
        max_message_bytes: Largest gRPC message this service's server and every channel it opens will
            receive or send (``POLAR_<SVC>_MAX_MESSAGE_BYTES``); generous by default (256 MiB) because a
            long session's completions and traces grow with its context.
        metrics_port: Port of this service's Prometheus ``/metrics`` endpoint (``docs/observability.md``); 0
            picks a free one, -1 (the default, except the gateway's 0) serves none.
        metrics_host: Interface the metrics endpoint binds.
        metrics_token: Bearer token a scrape of the metrics endpoint must present (the token, or
            ``sha256:<hex digest>``); empty: none (keep the port on a monitoring network then).
    """

    model_config = SettingsConfigDict(env_prefix="POLAR_", frozen=True, extra="forbid")
    toml_table: ClassVar[str] = "polar"
    _toml_path: ClassVar[Path | None] = None

    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535)
    state_dir: Path = Path(".polar")
    auth_token: str = ""
    trainer_token: str = ""
    gateway_token: str = ""
    internal_token: str = ""
    admin_token: str = ""
    insecure: bool = False
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_ca_file: Path | None = None
    max_message_bytes: int = Field(default=DEFAULT_MAX_MESSAGE_BYTES, ge=4 * 1024 * 1024, le=2**31 - 1)
    metrics_port: int = Field(default=-1, ge=-1, le=65535)
    metrics_host: str = "127.0.0.1"
    metrics_token: str = ""

    def tls(self) -> TlsFiles | None:
        """The mTLS files, or None when mTLS is off."""
        return TlsFiles.from_settings(self.tls_cert_file, self.tls_key_file, self.tls_ca_file)

    def accepted_tokens(self) -> dict[str, frozenset[Role]]:
        """Every token this service accepts and the roles it grants (digests keep their ``sha256:`` prefix).

        Empty when no token is set: calls then need none.

        Raises:
            InvalidArgument: A ``sha256:`` value is not 64 hex digits.
        """
        granted: dict[str, frozenset[Role]] = {}
        for value, roles in (
            (self.auth_token, ALL_ROLES),
            (self.trainer_token, frozenset({Role.TRAINER})),
            (self.gateway_token, frozenset({Role.GATEWAY})),
            (self.internal_token, frozenset({Role.INTERNAL})),
            (self.admin_token, frozenset({Role.ADMIN})),
        ):
            if not value:
                continue
            if value.startswith(TOKEN_DIGEST_PREFIX):
                digest = value[len(TOKEN_DIGEST_PREFIX) :].lower()
                if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                    raise InvalidArgument("a sha256: token setting needs the 64 hex digits of the token's SHA-256")
                value = TOKEN_DIGEST_PREFIX + digest
            granted[value] = granted.get(value, frozenset()) | roles
        return granted

    def presented_token(self, role: Role) -> str:
        """The token this service presents when it calls others as ``role``: that role's token, else ``auth_token``.

        Raises:
            InvalidArgument: The token to present is a ``sha256:`` digest (it can only verify).
        """
        own = {
            Role.TRAINER: self.trainer_token,
            Role.GATEWAY: self.gateway_token,
            Role.INTERNAL: self.internal_token,
        }.get(role, "")
        token = own or self.auth_token
        if token.startswith(TOKEN_DIGEST_PREFIX):
            raise InvalidArgument(
                f"the {role.value} token this service presents is a sha256: digest; give it the token itself"
            )
        return token

    def check_listen_security(self) -> None:
        """Refuse an unauthenticated server on a non-loopback address unless ``insecure`` is set.

        Raises:
            InvalidArgument: ``host`` is not loopback, no token is set, mTLS is off and ``insecure`` is false.
        """
        if self.insecure or is_loopback(self.host) or self.accepted_tokens() or self.tls() is not None:
            return
        prefix = str(self.model_config.get("env_prefix", "POLAR_"))
        raise InvalidArgument(
            f"refusing to listen on {self.host or 'every interface'} without authentication: set a token "
            f"({prefix}AUTH_TOKEN or the role tokens {prefix}TRAINER_TOKEN, {prefix}GATEWAY_TOKEN, "
            f"{prefix}INTERNAL_TOKEN), or mTLS ({prefix}TLS_CERT_FILE, ..._KEY_FILE, ..._CA_FILE), or pass "
            f"--insecure ({prefix}INSECURE=true) to serve the control plane to anyone who can reach it"
        )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _TomlTableSource(settings_cls, cls._toml_path, cls.toml_table))

    @classmethod
    def load(cls, toml_path: Path | None = None, **overrides: Any) -> Self:
        """Load settings: ``overrides`` (flags; ``None`` values ignored) > environment > TOML > defaults."""
        given = {k: v for k, v in overrides.items() if v is not None}
        if toml_path is None:
            return cls(**given)
        # A throwaway subclass carries the file path into settings_customise_sources without globals.
        bound = type(cls.__name__, (cls,), {"_toml_path": toml_path, "__module__": cls.__module__})
        return bound(**given)  # type: ignore[no-any-return]


class TelemetrySettings(BaseSettings):
    """The standard OpenTelemetry variables that switch OTLP export on (off when none is set)."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore", case_sensitive=False)

    otel_sdk_disabled: bool = False
    otel_traces_exporter: str = ""
    otel_exporter_otlp_endpoint: str = ""
    otel_exporter_otlp_traces_endpoint: str = ""
    otel_service_name: str = ""

    @property
    def export_enabled(self) -> bool:
        """Whether spans should be exported over OTLP."""
        if self.otel_sdk_disabled or self.otel_traces_exporter.strip().lower() == "none":
            return False
        return bool(
            self.otel_exporter_otlp_endpoint
            or self.otel_exporter_otlp_traces_endpoint
            or self.otel_traces_exporter.strip().lower() == "otlp"
        )
