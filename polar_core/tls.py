"""Mutual TLS for the control plane: server credentials that require client certificates, and client ones.

Either this or the shared token (or both) protects every service; with mTLS a caller without a certificate
signed by the configured CA never completes the handshake.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import grpc

from polar_core.errors import InvalidArgument

__all__ = ["TlsFiles", "client_credentials", "server_credentials"]


@dataclasses.dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files: this side's certificate and key, and the CA that must have signed the peer's certificate."""

    cert_file: Path
    key_file: Path
    ca_file: Path

    def _read(self) -> tuple[bytes, bytes, bytes]:
        try:
            return self.cert_file.read_bytes(), self.key_file.read_bytes(), self.ca_file.read_bytes()
        except OSError as exc:
            raise InvalidArgument(f"cannot read TLS file: {exc}") from None

    @classmethod
    def from_settings(cls, cert: Path | None, key: Path | None, ca: Path | None) -> TlsFiles | None:
        """All three paths, or None when none is set; a partial set is a configuration error."""
        given = [p for p in (cert, key, ca) if p is not None]
        if not given:
            return None
        if cert is None or key is None or ca is None:
            raise InvalidArgument("mTLS needs tls_cert_file, tls_key_file and tls_ca_file together")
        return cls(cert, key, ca)


def server_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """Server credentials that require and verify a client certificate."""
    cert, key, ca = files._read()
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)


def client_credentials(files: TlsFiles) -> grpc.ChannelCredentials:
    """Client credentials presenting this side's certificate and trusting only the configured CA."""
    cert, key, ca = files._read()
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
