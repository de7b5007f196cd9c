"""Who may see the dashboard: holders of a control-plane token that may read tasks, or of the dashboard key.

A browser cannot send ``authorization: Bearer`` on a page load or an ``EventSource``, so a valid secret is
exchanged once (a login form's POST, or ``?token=`` on the first visit) for a random session id in an
``HttpOnly; SameSite=Strict`` cookie; scripts may send the bearer header instead. Accepted secrets are the
all-roles ``auth_token``, ``trainer_token``, ``admin_token`` (each also as a ``sha256:`` digest) and the
``dashboard_key``; gateway and internal tokens are refused (they may not read tasks over gRPC either).

Secrets are compared in constant time, never logged, and never stored in a cookie.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from polar_core.secret_check import SecretCheck, bearer_token

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
        self._check = SecretCheck(secrets_, setting="dashboard secret")
        self._clock = clock
        self._sessions: OrderedDict[str, float] = OrderedDict()

    @property
    def open_access(self) -> bool:
        """Whether no secret is configured, so anyone who reaches the port sees the dashboard."""
        return self._check.open_access

    def check_secret(self, presented: str) -> bool:
        """Whether ``presented`` is an accepted secret (every comparison runs, whatever matches)."""
        return self._check(presented)

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
        if self.check_secret(bearer_token(authorization)):
            return True
        return self.check_session(cookie)
