"""Property-based fuzzing of every endpoint with malformed bodies: no crash, every error provider-shaped."""

from __future__ import annotations

import asyncio
import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from model_proxy.app import ProxyApp
from model_proxy.settings import ProxySettings
from model_proxy.tests.conftest import FakeBackend

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=12,
)

VALID: dict[str, dict[str, Any]] = {
    "/v1/messages": {
        "model": "p",
        "max_tokens": 16,
        "system": [{"type": "text", "text": "s"}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r"}]},
        ],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
    },
    "/v1/chat/completions": {
        "model": "p",
        "messages": [
            {"role": "system", "content": "s"},
            {
                "role": "assistant",
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "r"}]},
        ],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "stop": ["x"],
    },
    "/v1/responses": {
        "model": "p",
        "instructions": "s",
        "input": [
            {"role": "user", "content": "hi"},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "r"},
        ],
        "tools": [{"type": "function", "name": "f"}, {"type": "namespace", "name": "n", "tools": []}],
    },
    "/v1beta/models/p:generateContent": {
        "systemInstruction": {"parts": [{"text": "s"}]},
        "contents": [
            {"role": "user", "parts": [{"text": "hi"}]},
            {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"x": 1}}}]},
        ],
        "tools": [{"functionDeclarations": [{"name": "f", "parameters": {"type": "OBJECT"}}]}],
        "generationConfig": {"maxOutputTokens": 5},
    },
}


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += _paths(item, (*prefix, index))
    return out


def _set(body: Any, path: tuple[Any, ...], value: Any) -> Any:
    body = copy.deepcopy(body)
    target = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return body


def _provider_shaped(path: str, body: Any) -> bool:
    if path.endswith("/messages"):
        return body["type"] == "error" and {"type", "message"} <= set(body["error"])
    if "v1beta" in path:
        return {"code", "message", "status"} <= set(body["error"])
    return {"message", "type", "code"} <= set(body["error"])


@pytest.fixture(scope="module")
def fuzz_client(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from polar_core.model_fixtures import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    app = ProxyApp(ProxySettings(state_dir=Path(tmp_path_factory.mktemp("fuzz")), fsync=False), FakeBackend(tok), tok)
    _, token = asyncio.run(app.registry.open("fuzz", "p"))
    with TestClient(app.http.app, raise_server_exceptions=True) as client:
        client.headers["x-api-key"] = token
        yield client


def _check(client: TestClient, path: str, content: bytes) -> None:
    response = client.post(path, content=content, headers={"content-type": "application/json"})
    assert response.status_code < 500, response.text
    if response.status_code != 200:
        assert response.status_code in (400, 404, 409)
        assert _provider_shaped(path, response.json())
        assert "Traceback" not in response.text


_SETTINGS = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@pytest.mark.parametrize("path", list(VALID))
@_SETTINGS
@given(data=st.data())
def test_mutated_bodies_never_crash(fuzz_client: TestClient, path: str, data: st.DataObject) -> None:
    body = VALID[path]
    where = data.draw(st.sampled_from(_paths(body)))
    mutated = _set(body, where, data.draw(_JSON))
    _check(fuzz_client, path, json.dumps(mutated).encode())


@pytest.mark.parametrize("path", list(VALID))
@_SETTINGS
@given(raw=st.one_of(st.binary(max_size=64), _JSON.map(lambda v: json.dumps(v).encode())))
def test_garbage_bodies_are_400(fuzz_client: TestClient, path: str, raw: bytes) -> None:
    _check(fuzz_client, path, raw)


@pytest.mark.parametrize("path", list(VALID))
def test_deeply_nested_json_is_a_client_error(fuzz_client: TestClient, path: str) -> None:
    _check(fuzz_client, path, b"[" * 100_000 + b"]" * 100_000)
    _check(fuzz_client, path, b'{"model": "p", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}")
