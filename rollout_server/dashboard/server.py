"""The dashboard's HTTP server (aiohttp): the page, its static files, a JSON snapshot and a server-sent-event stream.

Routes:

* ``GET /`` — the dashboard (``401`` and the login form without a session; ``?token=`` is exchanged for a
  cookie and redirected away, so the secret leaves the address bar and any history at once);
* ``GET /login``, ``POST /login`` (form field ``token``), ``POST /logout``;
* ``GET /api/snapshot`` — one snapshot as JSON; ``GET /api/events`` — a snapshot per interval as SSE
  (``event: snapshot``; the first carries the over-time ``history``, the next ones ``history_append``, the new
  points only; when the server stops, ``event: finished`` before the stream ends, so the page says the run
  finished instead of retrying), both ``401`` without a session cookie or ``authorization: Bearer``;
* ``GET /static/...`` — the page's script, style and the vendored Chart.js (no data, open).

The access log is off (a ``?token=`` would otherwise land in it), every response carries a strict
Content-Security-Policy (scripts and styles from this origin only), and data is never cached.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from polar_core.errors import InvalidArgument
from polar_core.roles import TOKEN_DIGEST_PREFIX
from polar_core.settings import is_loopback
from rollout_server.dashboard.auth import COOKIE_NAME, DashboardAuth
from rollout_server.dashboard.data import DashboardData, DataConfig
from rollout_server.dashboard.hub import HISTORY_POINTS, SnapshotHub, event_body
from rollout_server.dashboard.proxy_metrics import ProxyMetricsSource
from rollout_server.settings import RolloutSettings
from rollout_server.store import Store

__all__ = ["Dashboard", "parse_address"]

_log = logging.getLogger(__name__)
STATIC = Path(__file__).with_name("static")
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_PING_S = 15.0
_FINISH_S = 1.0
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def parse_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:port`` for IPv6) as a pair.

    Raises:
        InvalidArgument: Not ``host:port`` with a port from 0 to 65535.
    """
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise InvalidArgument(
            f"dashboard_address must be host:port, not {address!r}", details={"dashboard_address": address}
        )
    return host, int(port)


def _tls_context(settings: RolloutSettings) -> ssl.SSLContext | None:
    """The HTTPS context of ``dashboard_tls_cert_file`` / ``_key_file``, or ``None`` when both are unset.

    Raises:
        InvalidArgument: Only one of the two is set, or they cannot be loaded.
    """
    cert, key = settings.dashboard_tls_cert_file, settings.dashboard_tls_key_file
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise InvalidArgument(
            "the dashboard's TLS needs both dashboard_tls_cert_file and dashboard_tls_key_file",
            details={"dashboard_tls_cert_file": str(cert or ""), "dashboard_tls_key_file": str(key or "")},
        )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidArgument(
            f"cannot load the dashboard's certificate {cert} and key {key}: {exc}",
            details={"dashboard_tls_cert_file": str(cert)},
        ) from exc
    return context


def _redirect(location: str) -> web.Response:
    """A ``303 See Other`` to ``location`` (returned, not raised, so a cookie can ride on it)."""
    return web.Response(status=303, headers={"Location": location})


@web.middleware
async def _headers(request: web.Request, handler: _Handler) -> web.StreamResponse:
    response = await handler(request)
    response.headers.setdefault("Content-Security-Policy", _CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "no-referrer")
    if not request.path.startswith("/static/"):
        response.headers.setdefault("Cache-Control", "no-store")
    return response


class Dashboard:
    """The dashboard server of one rollout server.

    Args:
        hub: The snapshot sampler.
        auth: Who may look.
        host: Interface to bind.
        port: Port (0 picks one).
        insecure: Whether the rollout server runs ``insecure`` (the page says so).
        tls: The HTTPS context, or ``None`` for plain HTTP.
    """

    def __init__(
        self,
        hub: SnapshotHub,
        auth: DashboardAuth,
        host: str,
        port: int,
        *,
        insecure: bool,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.hub = hub
        self.auth = auth
        self.host = host
        self.port = port
        self.insecure = insecure
        self.tls = tls
        self._runner: web.AppRunner | None = None
        self._closing = asyncio.Event()
        self._streams: set[asyncio.Task[Any]] = set()  # open event streams, each told "finished" at stop

    @staticmethod
    def check_settings(settings: RolloutSettings) -> DashboardAuth:
        """Check the dashboard settings and return who may look.

        Raises:
            InvalidArgument: A malformed ``dashboard_address``, or one off loopback that nobody has to log in to
                (no token configured) while the server is not ``insecure``; half a TLS pair or one that does not
                load; a digest as ``dashboard_proxy_metrics_token``.
        """
        host, _ = parse_address(settings.dashboard_address)
        _tls_context(settings)  # both files or neither, and loadable
        if settings.dashboard_proxy_metrics_token.startswith(TOKEN_DIGEST_PREFIX):
            raise InvalidArgument(
                "dashboard_proxy_metrics_token is presented to the proxies: give the token itself, not its digest",
                details={"dashboard_proxy_metrics_token": "sha256:..."},
            )
        secrets_ = (settings.auth_token, settings.trainer_token, settings.admin_token, settings.dashboard_key)
        auth = DashboardAuth(secrets_)
        if auth.open_access and not is_loopback(host) and not settings.insecure:
            raise InvalidArgument(
                f"refusing to serve the dashboard on {host} to anyone: set a trainer or admin token, a "
                "dashboard_key, or insecure",
                details={"dashboard_address": settings.dashboard_address},
            )
        return auth

    @classmethod
    def from_settings(cls, settings: RolloutSettings, store: Store) -> Dashboard:
        """Build the dashboard the settings ask for (``dashboard_address`` must be set; see :meth:`check_settings`)."""
        auth = cls.check_settings(settings)
        host, port = parse_address(settings.dashboard_address)
        data = DashboardData(store, DataConfig(jaeger_url=settings.dashboard_jaeger_url))
        hub = SnapshotHub(
            data,
            ProxyMetricsSource(settings.dashboard_proxy_metrics_urls, token=settings.dashboard_proxy_metrics_token),
        )
        return cls(hub, auth, host, port, insecure=settings.insecure, tls=_tls_context(settings))

    @property
    def url(self) -> str:
        """The dashboard's address (``http://host:port/``, ``https://`` with TLS)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{'127.0.0.1' if host in ('0.0.0.0', '[::]') else host}:{self.port}/"

    @property
    def plain_off_loopback(self) -> bool:
        """Whether secrets and cookies would cross a network in clear: plain HTTP beyond loopback."""
        return self.tls is None and not is_loopback(self.host)

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[_headers])
        app.add_routes(
            [
                web.get("/", self._index),
                web.get("/login", self._login_page),
                web.post("/login", self._login),
                web.post("/logout", self._logout),
                web.get("/api/snapshot", self._snapshot),
                web.get("/api/events", self._events),
                web.static("/static", STATIC, follow_symlinks=False),
            ]
        )
        return app

    async def start(self) -> None:
        """Bind and serve; :attr:`port` is the bound port afterwards."""
        runner = web.AppRunner(self._app(), access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port, ssl_context=self.tls).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        if runner.addresses:
            self.port = int(runner.addresses[0][1])
        _log.info("dashboard serving on %s", self.url)
        if self.plain_off_loopback:
            _log.warning(
                "the dashboard on %s is plain HTTP: its token and cookie cross the network in clear "
                "(set dashboard_tls_cert_file and dashboard_tls_key_file, or keep it on loopback)",
                self.url,
            )

    async def stop(self) -> None:
        """Stop serving and the sampler; idempotent. Open event streams are sent ``event: finished`` and ended
        first (each gets up to a second), so a watching page shows the run finished, not a lost connection."""
        self._closing.set()
        if self._streams:
            await asyncio.wait(list(self._streams), timeout=_FINISH_S)
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        await self.hub.close()

    # Auth ------------------------------------------------------------------------------------------------
    def _allowed(self, request: web.Request) -> bool:
        return self.auth.allowed(
            cookie=request.cookies.get(COOKIE_NAME, ""), authorization=request.headers.get("Authorization", "")
        )

    def _with_session(self, response: web.StreamResponse) -> web.StreamResponse:
        response.set_cookie(
            COOKIE_NAME,
            self.auth.open_session(),
            httponly=True,
            samesite="Strict",
            secure=self.tls is not None,  # over HTTPS the browser never sends it in clear
            path="/",
            max_age=12 * 3600,
        )
        return response

    def _login_response(self, status: int, message: str = "") -> web.Response:
        page = (STATIC / "login.html").read_text(encoding="utf-8")
        note = "<p class=error>That token does not open the dashboard.</p>" if message else ""
        return web.Response(status=status, text=page.replace("<!--note-->", note), content_type="text/html")

    async def _index(self, request: web.Request) -> web.StreamResponse:
        token = request.query.get("token", "")
        if token:
            if self.auth.check_secret(token):
                return self._with_session(_redirect("/"))
            return self._login_response(401, "bad token")
        if not self._allowed(request):
            return self._login_response(401)
        return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    async def _login_page(self, request: web.Request) -> web.StreamResponse:
        return self._login_response(200)

    async def _login(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        token = form.get("token")
        if isinstance(token, str) and self.auth.check_secret(token):
            return self._with_session(_redirect("/"))
        return self._login_response(401, "bad token")

    async def _logout(self, request: web.Request) -> web.StreamResponse:
        self.auth.close_session(request.cookies.get(COOKIE_NAME, ""))
        response = _redirect("/login")
        response.del_cookie(COOKIE_NAME, path="/")
        return response

    # Data ------------------------------------------------------------------------------------------------
    def _server_info(self) -> dict[str, Any]:
        return {
            "insecure": self.insecure,
            "open_access": self.auth.open_access,
            "jaeger": bool(self.hub.data.config.jaeger_url),
            "plain_http_off_loopback": self.plain_off_loopback,
            "interval_s": self.hub.interval_s,
            "history_points": HISTORY_POINTS,
        }

    def _refused(self) -> web.Response:
        return web.json_response(
            {"error": "log in to the dashboard: a trainer or admin token"},
            status=401,
            headers={"WWW-Authenticate": 'Bearer realm="polar-dashboard"'},
        )

    async def _snapshot(self, request: web.Request) -> web.StreamResponse:
        if not self._allowed(request):
            return self._refused()
        snapshot = await self.hub.build()
        return web.json_response({**snapshot, "server": self._server_info()})

    async def _events(self, request: web.Request) -> web.StreamResponse:
        if not self._allowed(request):
            return self._refused()
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        )
        await response.prepare(request)
        stream = asyncio.current_task()
        assert stream is not None  # aiohttp runs each handler in a task
        self._streams.add(stream)
        try:
            await self._stream(response)
        finally:
            self._streams.discard(stream)
        return response

    async def _stream(self, response: web.StreamResponse) -> None:
        """Write snapshots (and pings) until the browser leaves or the server stops; then ``event: finished``."""
        sent = 0  # the over-time points this browser has: the whole ring once, then only new points
        async with self.hub.watch() as queue:
            while True:
                snapshot = await self._next(queue)
                if self._closing.is_set():
                    finished = json.dumps({"at": time.time()}, separators=(",", ":"))
                    payload = f"event: finished\ndata: {finished}\n\n".encode()
                elif snapshot is None:
                    payload = b": ping\n\n"
                else:
                    event, sent = event_body(snapshot, sent)
                    body = json.dumps({**event, "server": self._server_info()}, separators=(",", ":"))
                    payload = f"event: snapshot\ndata: {body}\n\n".encode()
                try:
                    await response.write(payload)
                except (ConnectionResetError, RuntimeError):
                    break  # the browser went away
                if self._closing.is_set():
                    break
        with contextlib.suppress(ConnectionResetError, RuntimeError):
            await response.write_eof()

    async def _next(self, queue: asyncio.Queue[dict[str, Any]]) -> dict[str, Any] | None:
        """The next snapshot; ``None`` after :data:`_PING_S` without one, or at once when the server stops."""
        getter = asyncio.ensure_future(queue.get())
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            await asyncio.wait((getter, closing), timeout=_PING_S, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closing.cancel()
            if not getter.done():
                getter.cancel()
        return getter.result() if getter.done() and not getter.cancelled() else None
