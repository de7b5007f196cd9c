"""Who may see the dashboard: holders of a control-plane token that may read tasks, or of the dashboard key.

A browser cannot send ``authorization: Bearer`` on a page load or an ``EventSource``, so a valid secret is
exchanged once (a login form's POST, or ``?token=`` on the first visit) for a random session id in an
``HttpOnly; SameSite=Strict`` cookie; scripts may send the bearer header instead. Accepted secrets are the
all-roles ``auth_token``, ``trainer_token``, ``admin_token`` (each also as a ``sha256:`` digest) and the
``dashboard_key``; gateway and internal tokens are refused (they may not read tasks over gRPC either).

Secrets are compared in constant time, never logged, and never stored in a cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from polar_core.roles import TOKEN_DIGEST_PREFIX

__all__ = ["COOKIE_NAME", "DashboardAuth"]

COOKIE_NAME = "polar_dashboard"
_SESSION_TTL_S = 12 * 3600.0
_MAX_SESSIONS = 1024


class DashboardAuth:
    """Checks presented secrets and keeps the cookie sessions they open.

    Args:
        secrets_: The accepted secrets (empty strings ignored; ``sha256:<hex>`` entries match by digest).
        clock: Time source, for session expiry.
    """

    def __init__(self, secrets_: Iterable[str], *, clock: Callable[[], float] = time.monotonic) -> None:
        self._accepted = [
            (True, s.removeprefix(TOKEN_DIGEST_PREFIX).lower().encode())
            if s.startswith(TOKEN_DIGEST_PREFIX)
            else (False, s.encode())
            for s in secrets_
            if s
        ]
        self._clock = clock
        self._sessions: OrderedDict[str, float] = OrderedDict()

    @property
    def open_access(self) -> bool:
        """Whether no secret is configured, so anyone who reaches the port sees the dashboard."""
        return not self._accepted

    def check_secret(self, presented: str) -> bool:
        """Whether ``presented`` is an accepted secret (every comparison runs, whatever matches)."""
        if not presented:
            return False
        raw = presented.encode()
        digest = hashlib.sha256(raw).hexdigest().encode()
        ok = False
        for is_digest, expected in self._accepted:
            ok |= hmac.compare_digest(digest if is_digest else raw, expected)
        return ok

    def open_session(self) -> str:
        """A new cookie session id (the oldest session is dropped beyond a fixed number)."""
        sid = secrets.token_urlsafe(32)
        self._sessions[sid] = self._clock() + _SESSION_TTL_S
        while len(self._sessions) > _MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return sid

    def close_session(self, sid: str) -> None:
        """Forget a cookie session (logout)."""
        self._sessions.pop(sid, None)

    def check_session(self, sid: str) -> bool:
        """Whether ``sid`` names a live cookie session."""
        expiry = self._sessions.get(sid) if sid else None
        if expiry is None:
            return False
        if expiry < self._clock():
            del self._sessions[sid]
            return False
        return True

    def allowed(self, *, cookie: str, authorization: str) -> bool:
        """Whether a request with this cookie value and ``authorization`` header may see the dashboard."""
        if self.open_access:
            return True
        if authorization.startswith("Bearer ") and self.check_secret(authorization[len("Bearer ") :]):
            return True
        return self.check_session(cookie)
