"""The dashboard's HTTP side over a real rollout server (no browser): who gets in, what the stream carries, and
that it costs nothing until someone looks. Runs everywhere; the browser test is ``test_dashboard_browser.py``."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from integration_tests.test_core_mtls import _issue
from polar_client import RolloutClient, task_from_mapping
from polar_core.errors import InvalidArgument
from polar_core.server import RunningService
from rollout_server.app import RolloutApp
from rollout_server.server import start_server
from rollout_server.settings import RolloutSettings

TRAINER = "trainer-Secret-1"
GATEWAY = "gateway-Secret-2"
ADMIN = "admin-Secret-3"


@pytest.fixture
async def rollout(tmp_path: Path) -> AsyncIterator[RunningService[RolloutApp]]:
    settings = RolloutSettings(
        port=0,
        state_dir=tmp_path,
        trainer_token=TRAINER,
        gateway_token=GATEWAY,
        admin_token="sha256:" + hashlib.sha256(ADMIN.encode()).hexdigest(),
        dashboard_address="127.0.0.1:0",
        dashboard_jaeger_url="http://jaeger.example:16686",
        task_roots=[str(tmp_path)],
    )
    running = await start_server(settings)
    yield running
    await running.stop(1.0)


def _base(running: RunningService[RolloutApp]) -> str:
    assert running.app.dashboard is not None
    return running.app.dashboard.url.rstrip("/")


async def test_refused_without_a_trainer_or_admin_secret(rollout: RunningService[RolloutApp]) -> None:
    base = _base(rollout)
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.get(base + "/") as page:
            assert page.status == 401
            assert 'name="token"' in await page.text()
            assert "script-src 'self'" in page.headers["Content-Security-Policy"]
        for path in ("/api/snapshot", "/api/events"):
            for header in ({}, {"Authorization": f"Bearer {GATEWAY}"}, {"Authorization": "Bearer nope"}):
                async with http.get(base + path, headers=header) as refused:
                    assert refused.status == 401, (path, header)
        async with http.post(base + "/login", data={"token": GATEWAY}) as login:
            assert login.status == 401
        assert len(http.cookie_jar) == 0  # nothing opened a session
        async with http.get(base + "/static/../server.py") as traversal:
            assert traversal.status in (403, 404)
        async with http.get(base + "/static/vendor/chart.umd.min.js") as chart:
            assert chart.status == 200
            assert (await chart.text()).startswith("/*!\n * Chart.js v4.6.1")


async def test_token_becomes_a_cookie_and_the_stream_shows_the_task(
    rollout: RunningService[RolloutApp], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    base = _base(rollout)
    board = rollout.app.dashboard
    assert board is not None
    async with RolloutClient(f"127.0.0.1:{rollout.port}", token=TRAINER) as client:
        task = {"task_id": "watched", "instruction": "x", "num_samples": 3, "evaluator": {"strategy": "none"}}
        await client.submit(task_from_mapping(task))
    assert board.hub.snapshots_built == 0  # nobody looked: nothing was read for the dashboard
    # unsafe: keep cookies of an IP-address host (127.0.0.1), as browsers do
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.get(base + "/?token=" + ADMIN, allow_redirects=False) as exchange:
            assert exchange.status == 303
            assert exchange.headers["Location"] == "/"
            cookie = exchange.headers["Set-Cookie"]
            assert "HttpOnly" in cookie
            assert "SameSite=Strict" in cookie
            assert ADMIN not in cookie
        received = []
        async with http.get(base + "/api/events") as events:
            assert events.status == 200
            assert events.headers["Content-Type"].startswith("text/event-stream")
            async for line in events.content:
                if line.startswith(b"data: "):
                    received.append(json.loads(line[len(b"data: ") :]))
                    if len(received) == 3:
                        break
        async with http.get(base + "/api/snapshot", headers={"Authorization": f"Bearer {TRAINER}"}) as plain:
            assert plain.status == 200
            assert (await plain.json())["sessions_by_state"]["pending"] == 3
    # The first event carries the over-time points; the next ones only the points after those already sent (one
    # per snapshot, more if the reader was slow and skipped one).
    snapshot = received[0]
    assert [p["seq"] for p in snapshot["history"]] == [1]
    assert snapshot["history"][0]["sessions"]["pending"] == 3
    sent = 1
    for later in received[1:]:
        assert "history" not in later
        seqs = [p["seq"] for p in later["history_append"]]
        assert seqs == list(range(sent + 1, sent + 1 + len(seqs)))
        assert seqs
        sent = seqs[-1]
        assert later["tasks"][0]["task_id"] == "watched"
    row = snapshot["tasks"][0]
    assert row["task_id"] == "watched"
    assert row["sessions"]["pending"] == 3
    assert snapshot["server"] == {
        "insecure": False,
        "open_access": False,
        "jaeger": True,
        "plain_http_off_loopback": False,
        "interval_s": 1.0,
        "history_points": 720,
    }
    assert row["trace_url"] == ""  # an untraced submission has no trace to link to
    for _ in range(200):  # the stream notices the browser left at its next write (a snapshot per second)
        if board.hub.watchers == 0:
            break
        await asyncio.sleep(0.05)
    assert board.hub.watchers == 0  # and the sampler stopped with it
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for secret in (TRAINER, ADMIN, GATEWAY):
        assert secret not in logged


async def test_an_open_or_insecure_server_says_so(tmp_path: Path) -> None:
    settings = RolloutSettings(port=0, state_dir=tmp_path, insecure=True, dashboard_address="127.0.0.1:0")
    running = await start_server(settings)
    try:
        async with aiohttp.ClientSession() as http, http.get(_base(running) + "/api/snapshot") as reply:
            assert reply.status == 200  # no token configured: nothing to log in with
            assert (await reply.json())["server"]["insecure"] is True
            assert (await reply.json())["server"]["open_access"] is True
    finally:
        await running.stop(1.0)


async def test_a_stopping_server_tells_the_stream_the_run_finished(tmp_path: Path) -> None:
    """When the rollout server stops (the end of ``polar run``) an open event stream gets ``event: finished`` and
    then its end, instead of being cut (which a page can only show as a lost connection, and retries)."""
    settings = RolloutSettings(
        port=0, state_dir=tmp_path, trainer_token=TRAINER, dashboard_address="127.0.0.1:0", task_roots=[str(tmp_path)]
    )
    running = await start_server(settings)
    events: list[str] = []
    seqs: list[int] = []
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.get(_base(running) + "/api/events", headers={"Authorization": f"Bearer {TRAINER}"}) as stream,
        ):
            assert stream.status == 200
            stopping: asyncio.Task[None] | None = None
            async for raw in stream.content:  # ends when the server ends the stream
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    events.append(line.removeprefix("event: "))
                elif line.startswith("data: ") and events[-1] == "snapshot":
                    seqs.append(json.loads(line.removeprefix("data: "))["seq"])  # which snapshot this is
                    if stopping is None:
                        stopping = asyncio.create_task(running.stop(1.0))  # stop while the stream is open
                elif line.startswith("data: ") and events[-1] == "finished":
                    assert json.loads(line.removeprefix("data: "))["at"] > 0
            assert stopping is not None
            await stopping
    finally:
        await running.stop(1.0)
    # Snapshots (more than one if the sampler's next came before the stop reached the dashboard), then the end.
    assert events == ["snapshot"] * len(seqs) + ["finished"]
    assert seqs == list(range(1, len(seqs) + 1))


@pytest.mark.slow
async def test_the_embedded_stack_serves_every_metrics_endpoint_and_the_jaeger_link(tmp_path: Path) -> None:
    """``polar run --metrics --jaeger-url URL``'s stack: each of the five services answers a scrape as itself, and
    the dashboard has the Jaeger link (the page then links each task's trace)."""
    from integration_tests.support.prometheus import scrape
    from polar_run.embedded import EmbeddedStack, StackOptions

    options = StackOptions(
        state_dir=tmp_path,
        model="tiny",
        backend="scripted",
        backend_options={"turns": [{"text": "done"}]},
        dashboard=True,
        metrics=0,
        jaeger_url="http://j:16686",
    )
    async with EmbeddedStack.start(options) as stack:
        base, _, key = stack.dashboard_url.partition("?token=")
        scraped = {}
        for name, url in stack.metrics.items():
            port = int(url.removesuffix("/metrics").rpartition(":")[2])
            scraped[name] = await asyncio.to_thread(scrape, port)
        async with (
            aiohttp.ClientSession() as http,
            http.get(base + "api/snapshot", headers={"Authorization": f"Bearer {key}"}) as reply,
        ):
            server = (await reply.json())["server"]
    assert set(scraped) == {"gateway", "proxy", "rollout", "reconstructor", "evaluator"}
    for name, got in scraped.items():  # an idle service's endpoint answers, but empty until a first value
        assert not got.samples or got.has("target_info", service_name=f"polar-{name}"), name
    assert scraped["rollout"].has("polar_rollout_gateways", state="live")
    assert scraped["gateway"].has("polar_gateway_stage_workers", stage="running")
    assert server["jaeger"] is True


@pytest.mark.slow
def test_polar_run_plain_prints_the_dashboard_link_and_needs_no_browser(tmp_path: Path) -> None:
    from integration_tests.support.polar_cli import FIX_SCRIPT, command_task, run_polar, write_script

    script = write_script(tmp_path / "fix.jsonl", FIX_SCRIPT)
    out = tmp_path / "run"
    proc = run_polar(
        "run", str(command_task(tmp_path)), "--out", str(out), "--plain", "--backend", "scripted",
        "--backend-option", f"script={script}", "--model", "tiny", "--samples", "1",
        "--metrics", "--jaeger-url", "http://127.0.0.1:16686",
        cwd=tmp_path, timeout_s=150,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    links = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("dashboard http://127.0.0.1:")]
    assert len(links) == 1
    # --metrics: every embedded service's endpoint, one line each, as polar serve prints them.
    endpoints = dict(line.split(" metrics ") for line in proc.stdout.splitlines() if " metrics http://" in line)
    assert {name.strip() for name in endpoints} == {"gateway", "proxy", "rollout", "reconstructor", "evaluator"}
    assert len(set(endpoints.values())) == 5
    assert all(re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", url) for url in endpoints.values())
    key = links[0].partition("?token=")[2]
    assert len(key) >= 20
    assert "\x1b[" not in proc.stdout  # plain lines: no cursor movement, no colour
    assert "done=1" in proc.stdout
    assert key not in (out / "polar.log").read_text()  # the link is for the person at the terminal only


async def test_https_with_a_secure_cookie_and_half_a_tls_pair_refused(tmp_path: Path) -> None:
    """With ``dashboard_tls_cert_file`` / ``_key_file`` the dashboard speaks HTTPS only, its cookie is ``Secure``;
    one file without the other, or files that do not load, stop the server before it opens anything."""
    ca_cert, _ca_key, ca_name, ca_key = _issue(tmp_path, "ca", "polar-test-ca", None, ca=True)
    cert, key, _, _ = _issue(tmp_path, "dashboard", "dashboard", (ca_name, ca_key), ca=False)
    settings = RolloutSettings(
        port=0,
        state_dir=tmp_path / "state",
        trainer_token=TRAINER,
        dashboard_address="127.0.0.1:0",
        dashboard_tls_cert_file=cert,
        dashboard_tls_key_file=key,
    )
    running = await start_server(settings)
    try:
        base = _base(running)
        assert base.startswith("https://127.0.0.1:")
        trusted = ssl.create_default_context(cafile=str(ca_cert))
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            async with http.get(base + "/api/snapshot", ssl=trusted) as refused:
                assert refused.status == 401
            async with http.get(base + "/?token=" + TRAINER, ssl=trusted, allow_redirects=False) as exchange:
                assert exchange.status == 303
                cookie = exchange.headers["Set-Cookie"]
                assert "Secure" in cookie
                assert "HttpOnly" in cookie
            async with http.get(base + "/api/snapshot", ssl=trusted) as reply:
                assert reply.status == 200
                assert (await reply.json())["server"]["plain_http_off_loopback"] is False
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await http.get(base + "/api/snapshot")  # a client that does not trust the CA
            with pytest.raises(aiohttp.ClientError):
                await http.get(base.replace("https://", "http://") + "/api/snapshot")  # no plain HTTP on the port
    finally:
        await running.stop(1.0)
    both = "both dashboard_tls_cert_file and dashboard_tls_key_file"
    for pair, refusal in (((cert, None), both), ((None, key), both), ((key, cert), "cannot load the dashboard's")):
        with pytest.raises(InvalidArgument, match=refusal):
            await start_server(
                RolloutSettings(
                    port=0,
                    state_dir=tmp_path / "refused",
                    dashboard_address="127.0.0.1:0",
                    dashboard_tls_cert_file=pair[0],
                    dashboard_tls_key_file=pair[1],
                )
            )


async def test_plain_http_beyond_loopback_is_flagged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    settings = RolloutSettings(
        port=0, state_dir=tmp_path, trainer_token=TRAINER, dashboard_address="0.0.0.0:0", task_roots=[str(tmp_path)]
    )
    running = await start_server(settings)
    try:
        headers = {"Authorization": f"Bearer {TRAINER}"}
        async with (
            aiohttp.ClientSession() as http,
            http.get(_base(running) + "/api/snapshot", headers=headers) as reply,
        ):
            assert reply.status == 200
            assert (await reply.json())["server"]["plain_http_off_loopback"] is True
    finally:
        await running.stop(1.0)
    assert "cross the network in clear" in caplog.text
