"""Request limits: body size while reading, strict UTF-8 and surrogates, the per-session call cap, the context
precheck, and large requests handled off the event loop."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from model_proxy.app import ProxyApp
from model_proxy.core.render import max_token_chars
from model_proxy.models import ChatMessage
from model_proxy.tests.conftest import FakeBackend
from model_proxy.tests.test_http import ALL, _shape_ok

STREAMING = [(p, b) for p, b in ALL if "v1beta" not in p]


def _client(app: ProxyApp) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app.http.app), base_url="http://proxy")


def _with_prompt(path: str, body: dict[str, Any], text: str) -> dict[str, Any]:
    if "v1beta" in path:
        return {**body, "contents": [{"role": "user", "parts": [{"text": text}]}]}
    if path.endswith("/responses"):
        return {**body, "input": text}
    return {**body, "messages": [{"role": "user", "content": text}]}


@pytest.mark.parametrize(("path", "body"), ALL)
async def test_a_body_over_the_limit_is_413_declared_or_chunked(make_app, backend, path, body) -> None:
    app = make_app(backend, max_body_bytes=4096)
    _, token = await app.registry.open("s1", "policy")
    pulled = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal pulled
        for _ in range(1000):  # 1 MB if it were read whole
            pulled += 1
            yield b" " * 1024

    async with _client(app) as client:
        headers = {"x-api-key": token, "content-type": "application/json"}
        declared = await client.post(path, content=b" " * 5000, headers=headers)
        chunked = await client.post(path, content=chunks(), headers=headers)
    for response in (declared, chunked):
        assert response.status_code == 413, response.text
        assert _shape_ok(path, response.json())
    assert "content-length" not in chunked.request.headers  # really sent without a declared size
    assert pulled < 10  # the proxy stopped reading just past the limit
    assert backend.requests == []
    assert app.registry.get("s1").records == []


@pytest.mark.parametrize(("path", "body"), ALL)
async def test_invalid_utf8_and_lone_surrogates_are_400_before_generation(app, client, token, backend, path, body):
    raw = json.dumps(_with_prompt(path, body, "hi PLACEHOLDER")).encode()
    bad_bodies = [
        raw.replace(b"PLACEHOLDER", b"\xff\xfe"),  # not UTF-8
        raw.replace(b"PLACEHOLDER", b"\xed\xa0\x80"),  # an encoded surrogate: not UTF-8 either
        raw.replace(b"PLACEHOLDER", rb"\ud800"),  # a lone high surrogate escape
        raw.replace(b"PLACEHOLDER", rb"x\udfff"),  # a lone low surrogate escape
        raw.replace(b'"hi PLACEHOLDER"', b'"hi", "k\\udc00": 1'),  # in a key (of an unknown field)
        json.dumps(_with_prompt(path, body, "hi")).encode("utf-16"),  # another encoding is not guessed
    ]
    headers = {"x-api-key": token, "content-type": "application/json"}
    for content in bad_bodies:
        r = await client.post(path, content=content, headers=headers)
        assert r.status_code == 400, (content[:80], r.text)
        assert _shape_ok(path, r.json())
    assert backend.requests == []
    assert app.registry.get("s1").records == []
    pair = await client.post(path, content=raw.replace(b"PLACEHOLDER", rb"\ud83d\ude00"), headers=headers)
    assert pair.status_code == 200, pair.text  # a surrogate pair is one character: fine
    (record,) = app.registry.get("s1").records
    assert "\U0001f600" in json.dumps(record.request, ensure_ascii=False)


@pytest.mark.parametrize(("path", "body"), ALL)
async def test_a_session_over_its_call_cap_gets_a_retryable_429(make_app, tokenizer, path, body) -> None:
    backend = FakeBackend(tokenizer)
    backend.hold = asyncio.Event()
    app = make_app(backend, max_calls_per_session=2, retry_after_s=3)
    _, busy = await app.registry.open("busy", "policy")
    _, other = await app.registry.open("other", "policy")
    async with _client(app) as client:
        held = [asyncio.create_task(client.post(path, json=body, headers={"x-api-key": busy})) for _ in range(2)]
        while len(backend.requests) < 2:  # noqa: ASYNC110 - waits on the backend's own state
            await asyncio.sleep(0.01)
        refused = await client.post(path, json=body, headers={"x-api-key": busy})
        assert refused.status_code == 429, refused.text
        assert _shape_ok(path, refused.json())
        assert refused.headers["retry-after"] == "3"
        assert refused.headers["x-should-retry"] == "true"
        # Another session is not limited by this one's calls.
        other_call = asyncio.create_task(client.post(path, json=body, headers={"x-api-key": other}))
        while len(backend.requests) < 3:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        backend.hold.set()
        assert [r.status_code for r in await asyncio.gather(*held, other_call)] == [200, 200, 200]
        again = await client.post(path, json=body, headers={"x-api-key": busy})
        assert again.status_code == 200
    assert app.registry.get("busy").http_calls == 0
    assert len(app.registry.get("busy").records) == 3


@pytest.mark.parametrize(("path", "body"), STREAMING)
async def test_streams_give_their_slot_back_when_done_or_abandoned(make_app, backend, path, body) -> None:
    app = make_app(backend, max_calls_per_session=1)
    _, token = await app.registry.open("s1", "policy")
    session = app.registry.get("s1")
    async with _client(app) as client:
        for _ in range(3):  # one slot: each stream must have given it back for the next to start
            r = await client.post(path, json={**body, "stream": True}, headers={"x-api-key": token})
            assert r.status_code == 200, r.text
        async with client.stream("POST", path, json={**body, "stream": True}, headers={"x-api-key": token}) as r:
            assert r.status_code == 200
            # closed before reading the body
    for _ in range(100):
        if session.http_calls == 0 and session.in_flight == 0:
            break
        await asyncio.sleep(0.01)
    assert session.http_calls == 0
    assert session.in_flight == 0
    assert app.engine.gate.in_flight == 0


def test_the_precheck_bound_holds_for_the_tiny_tokenizer(tokenizer: Any) -> None:
    most = max_token_chars(tokenizer)
    assert most is not None
    assert most == max(len(t) for t in tokenizer.get_vocab())
    text = "".join(tokenizer.get_vocab())[:50_000]
    assert len(tokenizer.encode(text, add_special_tokens=False)) >= len(text) / most


@pytest.mark.parametrize(("path", "body"), ALL)
async def test_a_prompt_that_cannot_fit_is_refused_before_it_is_tokenised(
    app, client, token, backend, path, body, monkeypatch
) -> None:
    tokenised: list[int] = []
    renderer = app.engine.renderer
    real = renderer._encode

    def encode(text: str) -> Any:
        tokenised.append(len(text))
        return real(text)

    monkeypatch.setattr(renderer, "_encode", encode)
    huge = "cat big_file.txt\n" + "some line of a big file\n" * 420_000  # 10 MB
    r = await client.post(path, json=_with_prompt(path, body, huge), headers={"x-api-key": token})
    assert r.status_code == 400, r.text
    assert _shape_ok(path, r.json())
    error = r.json()["error"]
    if "v1beta" in path:
        assert error["status"] == "INVALID_ARGUMENT"
    elif path.endswith("/messages"):
        assert "prompt is too long" in error["message"]
    else:
        assert error["code"] == "context_length_exceeded"
    assert max(tokenised, default=0) < 1_000_000  # never the whole prompt
    assert backend.requests == []
    assert app.registry.get("s1").records == []


async def test_a_large_prompt_is_tokenised_off_the_event_loop(make_app, backend, monkeypatch) -> None:
    """While a large prompt of one session is being tokenised, another session's small call completes.

    The large prompt's tokenisation waits for the small call to finish; on the event loop that would be a
    deadlock (the test would time out), in a worker thread both complete.
    """
    app = make_app(backend, context_length=100_000, offload_bytes=10_000)
    _, big = await app.registry.open("big", "policy")
    _, small = await app.registry.open("small", "policy")
    renderer = app.engine.renderer
    real: Callable[[str], Any] = renderer._encode
    big_started, small_done = threading.Event(), threading.Event()

    def encode(text: str) -> Any:
        if len(text) > 50_000:
            big_started.set()
            assert small_done.wait(timeout=60), "the small call did not complete while the big one tokenised"
        return real(text)

    monkeypatch.setattr(renderer, "_encode", encode)
    path, body = "/v1/chat/completions", {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
    large = {**body, "messages": [{"role": "user", "content": "word " * 12_000}]}  # 60 kB: fits the context
    async with _client(app) as client:
        big_call = asyncio.create_task(client.post(path, json=large, headers={"x-api-key": big}))
        while not big_started.is_set():  # noqa: ASYNC110 - a threading.Event, set in a worker thread
            await asyncio.sleep(0.01)
        r = await client.post(path, json=body, headers={"x-api-key": small})
        assert r.status_code == 200
        small_done.set()
        assert (await big_call).status_code == 200
    assert [len(app.registry.get(s).records) for s in ("big", "small")] == [1, 1]


async def test_an_agent_loops_next_large_turn_is_prepared_on_the_loop_when_alone(
    make_app, backend, monkeypatch
) -> None:
    """A large body goes to a worker thread on a session's first call; a next turn that grew by less than
    ``offload_bytes``, with no other call in flight, is tokenised on the event loop (no thread round trips), and
    a turn that grew by more goes back to a worker thread. The prompts are the same either way."""
    app = make_app(backend, context_length=100_000, offload_bytes=10_000)
    _, token = await app.registry.open("s", "policy")
    renderer = app.engine.renderer
    real: Callable[[str], Any] = renderer._encode
    on_loop: list[bool] = []

    def encode(text: str) -> Any:
        on_loop.append(threading.current_thread() is threading.main_thread())
        return real(text)

    monkeypatch.setattr(renderer, "_encode", encode)
    path = "/v1/chat/completions"
    messages: list[dict[str, Any]] = [{"role": "user", "content": "word " * 3_000}]  # 15 kB
    seen: list[bool] = []
    async with _client(app) as client:
        for turn in range(4):
            if turn == 3:  # a jump of 20 kB: not an ordinary next turn
                messages.append({"role": "user", "content": "more " * 4_000})
            on_loop.clear()
            r = await client.post(path, json={"model": "policy", "messages": messages}, headers={"x-api-key": token})
            assert r.status_code == 200
            assert len(set(on_loop)) == 1
            seen.append(on_loop[0])
            messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": f"next {turn}"}]
    assert seen == [False, True, True, False]
    for record in app.registry.get("s").records:  # what was recorded is a full render and tokenisation
        turns = [ChatMessage(m["role"], m["content"]) for m in record.request["messages"]]
        assert record.prompt_token_ids == renderer._full(renderer.reference_text(turns, []))


async def test_count_tokens_refuses_nothing_and_counts_a_large_prompt(app, client, token) -> None:
    body = {"model": "policy", "messages": [{"role": "user", "content": "word " * 20_000}]}
    r = await client.post("/v1/messages/count_tokens", json=body, headers={"x-api-key": token})
    assert r.status_code == 200
    assert r.json()["input_tokens"] > 20_000 / 16


async def test_a_chunked_body_over_the_limit_is_413_through_uvicorn(make_app, backend) -> None:
    """Over a real socket: ``Transfer-Encoding: chunked`` with no size declared, refused while it arrives."""
    app = make_app(backend, max_body_bytes=4096)
    _, token = await app.registry.open("s1", "policy")
    await app.start()
    try:

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(64):
                yield b" " * 1024

        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{app.http_port}") as client:
            r = await client.post("/v1/messages", content=chunks(), headers={"x-api-key": token})
            assert r.request.headers["transfer-encoding"] == "chunked"
            assert r.status_code == 413
            assert r.json()["type"] == "error"
            ok = await client.post(
                "/v1/messages",
                json={"model": "policy", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
                headers={"x-api-key": token},
            )
            assert ok.status_code == 200
    finally:
        await app.close()
    assert len(app.registry.get("s1").records) == 1
