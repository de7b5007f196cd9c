from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from model_proxy.errors import BackendOverloaded, BackendUnavailable

ANTHROPIC = ("/v1/messages", {"model": "policy", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]})
CHAT = ("/v1/chat/completions", {"model": "policy", "messages": [{"role": "user", "content": "hi"}]})
RESPONSES = ("/v1/responses", {"model": "policy", "input": "hi"})
GOOGLE = ("/v1beta/models/policy:generateContent", {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
ALL = [ANTHROPIC, CHAT, RESPONSES, GOOGLE]


def _shape_ok(path: str, body: dict[str, Any]) -> bool:
    if path.endswith("/messages"):
        return body["type"] == "error" and isinstance(body["error"]["message"], str)
    if "v1beta" in path:
        return isinstance(body["error"]["status"], str) and isinstance(body["error"]["code"], int)
    return isinstance(body["error"]["message"], str) and "type" in body["error"]


@pytest.mark.parametrize(("path", "body"), ALL)
async def test_unknown_or_closed_token_is_401_and_nothing_is_recorded(app, client, backend, path, body) -> None:
    session, token = await app.registry.open("s1", "policy")
    for headers in ({}, {"x-api-key": "nope"}, {"authorization": "Bearer nope"}, {"x-goog-api-key": "x"}):
        r = await client.post(path, json=body, headers=headers)
        assert r.status_code == 401
        assert _shape_ok(path, r.json())
        assert "nope" not in r.text
    await app.registry.close("s1")
    r = await client.post(path, json=body, headers={"x-api-key": token})
    assert r.status_code == 401
    assert session.records == []
    assert backend.requests == []


@pytest.mark.parametrize(("path", "body"), ALL)
async def test_every_protocol_answers_and_records(app, client, token, path, body) -> None:
    r = await client.post("/some/prefix" + path, json=body, headers={"authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    assert "Hello there." in r.text
    (record,) = app.registry.get("s1").records
    assert record.seq == 0
    assert record.response_token_ids[-1] == app.engine.config.stop_token_ids[0]
    assert len(record.response_logprobs) == len(record.response_token_ids)
    assert record.response["text"] == "Hello there."
    assert token not in json.dumps(record.to_dict())


async def test_query_key_authenticates_google(client, token) -> None:
    path, body = GOOGLE
    r = await client.post(f"{path}?key={token}", json=body)
    assert r.status_code == 200


@pytest.mark.parametrize(("path", "body"), ALL)
async def test_streamed_and_plain_calls_capture_identical_tokens(app, client, token, backend, path, body) -> None:
    backend.replies = ['<think>\nhm\n</think>\n\nOK <tool_call>\n{"name": "ls", "arguments": {"d": 1}}\n</tool_call>']
    headers = {"x-api-key": token}
    stream_path = path.replace(":generateContent", ":streamGenerateContent?alt=sse")
    stream_body = body if "v1beta" in path else {**body, "stream": True}
    plain = await client.post(path, json=body, headers=headers)
    streamed = await client.post(stream_path, json=stream_body, headers=headers)
    assert plain.status_code == streamed.status_code == 200
    assert streamed.headers["content-type"].startswith("text/event-stream")
    a, b = app.registry.get("s1").records
    assert a.response_token_ids == b.response_token_ids
    assert a.response_logprobs == b.response_logprobs
    for rec in (a, b):
        for tool_call in rec.response["tool_calls"]:
            tool_call.pop("id")
    assert a.response == b.response
    assert a.response["tool_calls"] == [{"name": "ls", "arguments": {"d": 1}}]
    assert a.response["reasoning"] == "hm"
    assert a.response["text"] == "OK"
    assert a.finish_reason == b.finish_reason == "tool_calls"
    assert backend.requests[1].stream
    assert not backend.requests[0].stream


async def test_context_length_errors_are_provider_shaped(make_app, backend) -> None:
    app = make_app(backend, context_length=20)
    _, token = await app.registry.open("s1", "policy")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app.http.app), base_url="http://p") as c:
        r = await c.post(CHAT[0], json=CHAT[1], headers={"x-api-key": token})
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "context_length_exceeded"
        r = await c.post(ANTHROPIC[0], json=ANTHROPIC[1], headers={"x-api-key": token})
        assert r.status_code == 400
        assert "prompt is too long" in r.json()["error"]["message"]
        r = await c.post(GOOGLE[0], json=GOOGLE[1], headers={"x-api-key": token})
        assert r.status_code == 400
        assert r.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert backend.requests == []


async def test_backend_overload_and_outage_carry_retry_hints(client, token, backend) -> None:
    backend.error = BackendOverloaded("busy", retry_after_s=2.5)
    r = await client.post(ANTHROPIC[0], json=ANTHROPIC[1], headers={"x-api-key": token})
    assert r.status_code == 529
    assert r.json()["error"]["type"] == "overloaded_error"
    assert r.headers["retry-after"] == "3"
    r = await client.post(CHAT[0], json=CHAT[1], headers={"x-api-key": token})
    assert r.status_code == 503
    assert r.headers["retry-after"] == "3"
    backend.error = BackendUnavailable("down")
    r = await client.post(GOOGLE[0], json=GOOGLE[1], headers={"x-api-key": token})
    assert r.status_code == 503
    assert r.json()["error"]["status"] == "UNAVAILABLE"
    backend.error = RuntimeError("secret internals")
    r = await client.post(CHAT[0], json={**CHAT[1], "stream": True}, headers={"x-api-key": token})
    assert r.status_code == 500
    assert "secret" not in r.text
    assert "Traceback" not in r.text


async def test_head_models_and_unknown_routes(client, token) -> None:
    assert (await client.head("/")).status_code == 200
    r = await client.get("/v1/models", headers={"x-api-key": token})
    assert r.status_code == 200
    assert r.json()["data"][0]["id"] == "policy"
    r = await client.get("/v1beta/models", headers={"x-goog-api-key": token})
    assert r.json()["models"][0]["name"] == "models/policy"
    r = await client.post("/v1/nothing", json={}, headers={"x-api-key": token})
    assert r.status_code == 404
    assert "error" in r.json()


async def test_count_tokens(client, token) -> None:
    r = await client.post(
        "/v1/messages/count_tokens",
        json={"model": "p", "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-api-key": token},
    )
    assert r.status_code == 200
    assert r.json()["input_tokens"] > 5


async def test_policy_version_pause_and_resume(app, client, token, backend) -> None:
    app.engine.policy_version = "v7"
    gate = app.engine.gate
    await gate.pause(abort_in_flight=False, drain_timeout_s=1)
    held = asyncio.create_task(client.post(CHAT[0], json=CHAT[1], headers={"x-api-key": token}))
    while gate._held == 0:  # noqa: ASYNC110 - waits on the proxy's own state, one loop turn at a time
        await asyncio.sleep(0)
    assert backend.requests == []
    app.engine.policy_version = "v8"
    assert gate.resume() == 1
    assert (await held).status_code == 200
    assert app.registry.get("s1").records[0].policy_version == "v8"


async def test_pause_drains_or_aborts_in_flight_calls(app, client, token, backend) -> None:
    backend.hold = asyncio.Event()
    call = asyncio.create_task(client.post(CHAT[0], json={**CHAT[1], "stream": True}, headers={"x-api-key": token}))
    while not backend.requests:  # noqa: ASYNC110
        await asyncio.sleep(0)
    in_flight, aborted = await app.engine.gate.pause(abort_in_flight=True, drain_timeout_s=5)
    assert (in_flight, aborted) == (1, 1)
    r = await call
    # A cut call is never an answer: a retryable error (here before the stream began: a plain 503), while
    # its record stays, marked "abort".
    if r.status_code == 200:
        assert '"type":"server_error"' in r.text
        assert "[DONE]" not in r.text
    else:
        assert r.status_code == 503
        assert r.json()["error"]["type"] == "server_error"
        assert r.headers["x-should-retry"] == "true"
    (record,) = app.registry.get("s1").records
    assert record.finish_reason == "abort"
    app.engine.gate.resume()


async def test_records_survive_a_restart(make_app, backend, tokenizer) -> None:
    app = make_app(backend)
    _, token = await app.registry.open("s1", "policy")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app.http.app), base_url="http://p") as c:
        assert (await c.post(CHAT[0], json=CHAT[1], headers={"x-api-key": token})).status_code == 200
    before = app.registry.get("s1").records[0].to_dict()
    again = make_app(backend)
    assert again.registry.load() == 1
    assert again.registry.get("s1").records[0].to_dict() == before
    assert again.registry.authenticate(token).session_id == "s1"


async def test_watch_streams_records_until_closed(app, client, token) -> None:
    seen = []

    async def watch() -> None:
        async for record in app.registry.watch("s1", 0):
            seen.append(record.seq)

    watcher = asyncio.create_task(watch())
    for _ in range(2):
        assert (await client.post(CHAT[0], json=CHAT[1], headers={"x-api-key": token})).status_code == 200
    await app.registry.close("s1")
    await asyncio.wait_for(watcher, 5)
    assert seen == [0, 1]


async def test_follow_up_call_reuses_prefix_and_names_parent(app, client, token, backend) -> None:
    first = {"model": "p", "messages": [{"role": "user", "content": "hi " * 40}]}
    assert (await client.post(CHAT[0], json=first, headers={"x-api-key": token})).status_code == 200
    second = {
        "model": "p",
        "messages": [
            *first["messages"],
            {"role": "assistant", "content": "Hello there."},
            {"role": "user", "content": "and?"},
        ],
    }
    assert (await client.post(CHAT[0], json=second, headers={"x-api-key": token})).status_code == 200
    a, b = app.registry.get("s1").records
    assert b.parent_call_id == a.call_id
    assert b.prompt_token_ids[: len(a.prompt_token_ids)] == a.prompt_token_ids
    assert (
        b.prompt_token_ids[: len(a.prompt_token_ids) + len(a.response_token_ids)]
        == a.prompt_token_ids + a.response_token_ids
    )
