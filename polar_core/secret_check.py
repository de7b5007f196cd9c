"""One constant-time check of a presented secret against accepted ones (plain, or ``sha256:<hex digest>``).

Shared by every HTTP surface that takes a bearer secret outside gRPC (the dashboard, the metrics endpoints).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from polar_core.errors import InvalidArgument
from polar_core.roles import TOKEN_DIGEST_PREFIX

__all__ = ["SecretCheck", "bearer_token"]

_HEX = frozenset("0123456789abcdef")


class SecretCheck:
    """Accepts a presented secret when it equals one of ``accepted`` (or its SHA-256 matches a digest entry).

    Args:
        accepted: Secrets, empty ones ignored; ``sha256:<64 hex digits>`` entries match by digest.
        setting: The setting's name, for the error a malformed digest gets.

    Raises:
        InvalidArgument: A ``sha256:`` entry is not 64 hex digits.
    """

    def __init__(self, accepted: Iterable[str], *, setting: str = "token") -> None:
        self._accepted: list[tuple[bool, bytes]] = []
        for secret in accepted:
            if not secret:
                continue
            if secret.startswith(TOKEN_DIGEST_PREFIX):
                digest = secret.removeprefix(TOKEN_DIGEST_PREFIX).lower()
                if len(digest) != 64 or not set(digest) <= _HEX:
                    raise InvalidArgument(f"{setting}: a sha256: value needs the 64 hex digits of the secret's SHA-256")
                self._accepted.append((True, digest.encode()))
            else:
                self._accepted.append((False, secret.encode()))

    @property
    def open_access(self) -> bool:
        """Whether nothing is accepted because nothing is configured (the surface needs no secret)."""
        return not self._accepted

    def __call__(self, presented: str) -> bool:
        """Whether ``presented`` is accepted; every comparison runs, so timing says nothing of which matched."""
        if not presented:
            return False
        raw = presented.encode()
        digest = hashlib.sha256(raw).hexdigest().encode()
        ok = False
        for is_digest, expected in self._accepted:
            ok |= hmac.compare_digest(digest if is_digest else raw, expected)
        return ok


def bearer_token(header: str) -> str:
    """The token of an ``Authorization: Bearer <token>`` header value ("" for anything else)."""
    scheme, _, token = header.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""
