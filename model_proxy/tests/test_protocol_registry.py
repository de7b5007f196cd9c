"""The HTTP app's routes come from the registered protocol adapters (``model_proxy.protocols.PROTOCOLS``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from model_proxy.app import ProxyApp
from model_proxy.http.app import ProxyHttp
from model_proxy.protocols import FALLBACK_PROTOCOL, PROTOCOLS, OpenAIChatAdapter, Route
from polar_core.registry import Registry

CHAT_BODY = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}


class _EchoAdapter(OpenAIChatAdapter):
    """A protocol of the test's own: OpenAI chat bodies at ``POST .../echo``, counted at ``.../echo/count``."""

    protocol = "echo"
    routes: tuple[Route, ...] = (Route(r"/echo$"), Route(r"/echo/count$", count_tokens=lambda n: {"n": n}))
    header_marks: tuple[str, ...] = ("x-echo",)


@pytest.fixture
async def echo_client(app: ProxyApp) -> AsyncIterator[httpx.AsyncClient]:
    http = ProxyHttp(app.engine, retry_after_s=1.0, max_body_bytes=1 << 20, model_name="policy",
                     protocols=Registry("protocol", [("echo", _EchoAdapter)]))  # fmt: skip
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=http.app), base_url="http://proxy") as client:
        yield client


def test_every_registered_adapter_is_named_by_its_protocol_and_declares_routes() -> None:
    assert {"anthropic_messages", "openai_chat", "openai_responses", "google_generate"} <= set(PROTOCOLS)
    assert FALLBACK_PROTOCOL in PROTOCOLS
    for name, factory in PROTOCOLS.items():
        adapter = factory()
        assert adapter.protocol == name
        assert adapter.routes


@pytest.mark.parametrize(
    ("path", "protocol", "model", "stream"),
    [
        ("/v1/messages", "anthropic_messages", None, False),
        ("/x/v1/messages/count_tokens", "anthropic_messages", None, False),
        ("/v1/chat/completions", "openai_chat", None, False),
        ("/v1/responses", "openai_responses", None, False),
        ("/v1beta/models/policy:generateContent", "google_generate", "policy", False),
        ("/v1beta/models/policy:streamGenerateContent", "google_generate", "policy", True),
    ],
)
def test_each_builtin_path_is_matched_by_the_route_its_adapter_declares(
    path: str, protocol: str, model: str | None, stream: bool
) -> None:
    matches = [
        (name, route.match(path)) for name, factory in PROTOCOLS.items() for route in factory().routes
    ]  # fmt: skip
    ((name, match),) = [(name, m) for name, m in matches if m is not None]
    assert name == protocol
    assert match.groupdict().get("model") == model
    assert (match.groupdict().get("stream") is not None) == stream


async def test_the_app_serves_the_routes_of_the_adapters_it_is_given_and_no_other(
    app: ProxyApp, echo_client: httpx.AsyncClient, token: str
) -> None:
    headers = {"authorization": f"Bearer {token}"}
    answer = await echo_client.post("/v1/echo", json=CHAT_BODY, headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "Hello there."
    (_record,) = app.registry.get("s1").records
    counted = await echo_client.post("/v1/echo/count", json=CHAT_BODY, headers=headers)
    assert counted.status_code == 200
    assert counted.json()["n"] > 0
    missing = await echo_client.post("/v1/chat/completions", json=CHAT_BODY, headers=headers)
    assert missing.status_code == 404


@pytest.mark.parametrize(
    ("path", "headers", "shape"),
    [
        ("/v1/models", {}, "data"),
        ("/v1beta/models", {}, "models"),
        ("/v1/models", {"x-goog-api-key": "k"}, "models"),
        ("/v1/models", {"anthropic-version": "2023-06-01"}, "data"),
    ],
)
async def test_model_listing_comes_in_the_shape_of_the_protocol_the_marks_name(
    client: httpx.AsyncClient, token: str, path: str, headers: dict[str, Any], shape: str
) -> None:
    auth = {"x-api-key": token} if "x-goog-api-key" not in headers else {"x-goog-api-key": token}
    answer = await client.get(path, headers={**headers, **auth})
    assert answer.status_code == 200, answer.text
    assert shape in answer.json()


async def test_an_unknown_path_is_refused_in_the_marked_protocols_shape(client: httpx.AsyncClient) -> None:
    google = await client.post("/v1/nothing", json={}, headers={"x-goog-api-key": "k"})
    anthropic = await client.post("/v1/nothing", json={}, headers={"anthropic-version": "2023-06-01"})
    fallback = await client.post("/v1/nothing", json={})
    assert google.status_code == anthropic.status_code == fallback.status_code == 404
    assert isinstance(google.json()["error"]["status"], str)
    assert anthropic.json()["type"] == "error"
    assert "type" in fallback.json()["error"]
    assert "status" not in fallback.json()["error"]
