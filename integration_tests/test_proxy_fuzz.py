"""A seeded fuzzer over the proxy's four protocols: 10,000 mutated requests, streaming and not.

Valid requests of each protocol are mutated (type swaps, deletions, huge strings and prompts, lone surrogates,
invalid UTF-8, deep nesting, many messages, extreme numbers, wrong content types, truncated and chunked bodies,
the streaming flag) and sent to the real Starlette app in process, with the scripted backend behind it, 16 at
a time over 4 sessions (so the per-session call cap is hit too). Every response must come back within the
per-request limit, none may be a 5xx, every error body must validate against the protocol's own error schema
(the Anthropic and OpenAI SDKs' models; Google's ``{"error": {code, message, status}}``), and no answered
stream may carry an error event. ``FUZZ_REQUESTS`` and ``FUZZ_SEED`` change the run; the figures are printed.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import json
import os
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from anthropic.types import ErrorResponse
from openai.types import ErrorObject

from model_proxy.app import ProxyApp
from model_proxy.backends.scripted import ScriptedBackend, ScriptTurn
from model_proxy.settings import ProxySettings
from polar_core.model_fixtures import build_tiny_tokenizer

pytestmark = pytest.mark.slow

REQUESTS = int(os.environ.get("FUZZ_REQUESTS", "10000"))
SEED = int(os.environ.get("FUZZ_SEED", "20261202"))
TIMEOUT_S = 20.0  # per request, body included; a hang is anything longer
CONCURRENCY = 16
SESSIONS = 4

ANTHROPIC = "/v1/messages"
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
GOOGLE = "/v1beta/models/policy:generateContent"
GOOGLE_STREAM = "/v1beta/models/policy:streamGenerateContent"

BASES: dict[str, dict[str, Any]] = {
    ANTHROPIC: {
        "model": "policy",
        "max_tokens": 16,
        "system": [{"type": "text", "text": "You are terse."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "list the files"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ls", "input": {"d": "."}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.py b.py"}]},
        ],
        "tools": [{"name": "ls", "description": "list", "input_schema": {"type": "object"}}],
        "temperature": 0.5,
    },
    CHAT: {
        "model": "policy",
        "max_tokens": 16,
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "list the files"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "a.py b.py"}]},
        ],
        "tools": [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}],
        "stop": ["\n\n\n"],
    },
    RESPONSES: {
        "model": "policy",
        "max_output_tokens": 16,
        "instructions": "You are terse.",
        "input": [
            {"role": "user", "content": "list the files"},
            {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "a.py b.py"},
        ],
        "tools": [{"type": "function", "name": "ls", "parameters": {"type": "object"}}],
    },
    GOOGLE: {
        "systemInstruction": {"parts": [{"text": "You are terse."}]},
        "contents": [
            {"role": "user", "parts": [{"text": "list the files"}]},
            {"role": "model", "parts": [{"functionCall": {"name": "ls", "args": {"d": "."}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "ls", "response": {"out": "a.py"}}}]},
        ],
        "tools": [{"functionDeclarations": [{"name": "ls", "parameters": {"type": "OBJECT"}}]}],
        "generationConfig": {"maxOutputTokens": 16, "temperature": 0.5},
    },
}
GOOGLE_STATUSES = {
    "INVALID_ARGUMENT",
    "FAILED_PRECONDITION",
    "UNAUTHENTICATED",
    "PERMISSION_DENIED",
    "NOT_FOUND",
    "RESOURCE_EXHAUSTED",
    "UNAVAILABLE",
    "DEADLINE_EXCEEDED",
    "UNIMPLEMENTED",
    "INTERNAL",
}
SWAPS: list[Any] = [None, True, False, 0, -1, 2**64, -(2**70), 1e308, 0.5, "", "x", [], {}, [1, "a"], {"a": None}]
BAD_BYTES = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80\x80", b"\xc0\xaf"]
HUGE_PROMPT = "cat big_file.txt\n" + "some line of a big file\n" * 420_000  # 10 MB: never fits the context


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += _paths(item, (*prefix, index))
    return out


def _string_paths(body: Any) -> list[tuple[Any, ...]]:
    return [p for p in _paths(body) if isinstance(_get(body, p), str)]


def _get(body: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        body = body[key]
    return body


def _set(body: Any, path: tuple[Any, ...], value: Any) -> None:
    _get(body, path[:-1])[path[-1]] = value


def _prompt_path(path: str) -> tuple[Any, ...]:
    return {
        ANTHROPIC: ("messages", 0, "content", 0, "text"),
        CHAT: ("messages", 1, "content"),
        RESPONSES: ("input", 0, "content"),
    }.get(path, ("contents", 0, "parts", 0, "text"))


class Case:
    """One fuzzed request: path, headers, body bytes (or chunks) and what was done to it."""

    def __init__(self, rng: random.Random) -> None:
        self.protocol = rng.choice(list(BASES))
        body = copy.deepcopy(BASES[self.protocol])
        self.path = self.protocol
        self.stream = rng.random() < 0.5
        if self.protocol == GOOGLE:
            if self.stream:
                self.path = GOOGLE_STREAM + ("?alt=sse" if rng.random() < 0.8 else "")
        else:
            body["stream"] = self.stream
        self.headers = {"content-type": "application/json"}
        self.chunked = False
        self.kind = rng.choices(
            [
                "valid",
                "swap",
                "delete",
                "huge_string",
                "huge_prompt",
                "surrogate",
                "bad_utf8",
                "nesting",
                "many_messages",
                "numbers",
                "content_type",
                "truncated",
                "stream_flag",
                "garbage",
            ],
            weights=[120, 160, 100, 30, 2, 80, 80, 40, 4, 60, 60, 80, 60, 40],
        )[0]
        raw: bytes | None = None
        if self.kind == "swap":
            _set(body, rng.choice(_paths(body)), copy.deepcopy(rng.choice(SWAPS)))
        elif self.kind == "delete":
            where = rng.choice(_paths(body))
            del _get(body, where[:-1])[where[-1]]
        elif self.kind == "huge_string":
            size = rng.choice([10_000, 100_000, 1_000_000])
            _set(body, rng.choice(_string_paths(body)), rng.choice("ab \n{<") * size)
        elif self.kind == "huge_prompt":
            _set(body, _prompt_path(self.protocol), HUGE_PROMPT)
        elif self.kind == "surrogate":
            where = rng.choice([*_string_paths(body), _prompt_path(self.protocol)])
            lone = chr(rng.randrange(0xD800, 0xE000))
            _set(body, where, str(_get(body, where)) + lone)
            if rng.random() < 0.3:  # sent as encoded surrogate bytes instead of an escape
                raw = json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
        elif self.kind == "many_messages":
            key = {ANTHROPIC: "messages", CHAT: "messages", RESPONSES: "input", GOOGLE: "contents"}[self.protocol]
            body[key] = body[key] * rng.choice([100, 300, 1000])
        elif self.kind == "stream_flag":
            body["stream"] = rng.choice([None, "yes", 1, 0, [], {"a": 1}, "true"])
        elif self.kind == "content_type":
            self.headers["content-type"] = rng.choice(
                ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""]
            )
        if raw is None:
            raw = json.dumps(body).encode()
        if self.kind == "bad_utf8":
            marker = rng.choice([b"list the files", b"You are terse.", b"a.py"])
            bad = rng.choice(BAD_BYTES)
            raw = raw.replace(marker, marker + bad, 1) if marker in raw else raw[:-1] + bad + raw[-1:]
        elif self.kind == "nesting":
            depth = rng.choice([1_000, 50_000, 200_000])
            where = rng.choice(_paths(body))
            _set(body, where, "__NEST__")
            raw = json.dumps(body).encode().replace(b'"__NEST__"', b"[" * depth + b"]" * depth, 1)
        elif self.kind == "numbers":
            number = rng.choice([b"1e999", b"-1e999", b"NaN", b"Infinity", b"-0", b"1e-400", b"99999999999999999999"])
            raw = raw.replace(b"16", number, 1) if b"16" in raw else raw
        elif self.kind == "truncated":
            raw = raw[: rng.randrange(0, len(raw))]
        elif self.kind == "garbage":
            raw = rng.randbytes(rng.randrange(0, 200))
        self.raw = raw
        self.chunked = rng.random() < 0.2

    def content(self) -> bytes | AsyncIterator[bytes]:
        if not self.chunked:
            return self.raw

        async def chunks() -> AsyncIterator[bytes]:
            for start in range(0, len(self.raw), 65_536):
                yield self.raw[start : start + 65_536]

        return chunks()


def _error_shaped(protocol: str, status: int, body: Any) -> bool:
    try:
        if protocol == ANTHROPIC:
            ErrorResponse.model_validate(body)
            return True
        if protocol == GOOGLE:
            error = body["error"]
            return (
                set(body) == {"error"}
                and error["code"] == status
                and isinstance(error["message"], str)
                and error["status"] in GOOGLE_STATUSES
            )
        ErrorObject.model_validate(body["error"])
        return set(body) == {"error"}
    except Exception:
        return False


def _stream_has_error(protocol: str, text: str) -> bool:
    if protocol == ANTHROPIC:
        return "event: error" in text
    if protocol == RESPONSES:
        return "response.failed" in text
    return any(line.startswith('data: {"error"') for line in text.splitlines())


@pytest.fixture
async def proxy(tmp_path: Path) -> tuple[ProxyApp, list[str]]:
    tokenizer = build_tiny_tokenizer()
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert isinstance(eot, int)
    backend = ScriptedBackend([ScriptTurn(text="Done: a.py b.py")] * REQUESTS, tokenizer, end_of_turn_id=eot)
    settings = ProxySettings(state_dir=tmp_path, fsync=False, gc_freeze=False, max_body_bytes=16 * 1024 * 1024)
    app = ProxyApp(settings, backend, tokenizer)
    tokens = [(await app.registry.open(f"fuzz-{i}", "policy"))[1] for i in range(SESSIONS)]
    return app, tokens


async def test_ten_thousand_fuzzed_requests_no_5xx_no_hang_every_error_provider_shaped(
    proxy: tuple[ProxyApp, list[str]],
) -> None:
    app, tokens = proxy
    rng = random.Random(SEED)
    cases = [(Case(random.Random(rng.getrandbits(64))), rng.choice(tokens)) for _ in range(REQUESTS)]
    statuses: collections.Counter[int] = collections.Counter()
    kinds: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    failures: list[str] = []
    latencies: list[float] = []
    queue: asyncio.Queue[tuple[Case, str]] = asyncio.Queue()
    for item in cases:
        queue.put_nowait(item)

    async def one(client: httpx.AsyncClient, case: Case, token: str) -> None:
        headers = {**case.headers, "x-api-key": token}
        started = time.perf_counter()
        try:
            async with asyncio.timeout(TIMEOUT_S):
                async with client.stream("POST", case.path, content=case.content(), headers=headers) as response:
                    data = await response.aread()
        except TimeoutError:
            failures.append(f"hang: {case.kind} {case.path}")
            return
        latencies.append(time.perf_counter() - started)
        status = response.status_code
        statuses[status] += 1
        kinds[case.kind][status] += 1
        if status >= 500:
            failures.append(f"{status}: {case.kind} {case.path}: {data[:200]!r}")
        elif status != 200:
            try:
                body = json.loads(data)
            except ValueError:
                body = None
            if not _error_shaped(case.protocol, status, body):
                failures.append(f"not provider-shaped {status}: {case.kind} {case.path}: {data[:200]!r}")
        elif response.headers.get("content-type", "").startswith("text/event-stream"):
            if _stream_has_error(case.protocol, data.decode("utf-8", "replace")):
                failures.append(f"error event in a 200 stream: {case.kind} {case.path}: {data[-300:]!r}")
        else:
            json.loads(data)

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            case, token = queue.get_nowait()
            await one(client, case, token)

    transport = httpx.ASGITransport(app=app.http.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy", timeout=None) as client:
        await asyncio.gather(*(worker(client) for _ in range(CONCURRENCY)))

    print(f"\nfuzzed {REQUESTS} requests (seed {SEED}): statuses {dict(sorted(statuses.items()))}")
    print(f"max latency {max(latencies):.2f} s, streamed {sum(c.stream for c, _ in cases)}")
    for kind, counter in sorted(kinds.items()):
        print(f"  {kind:14} {dict(sorted(counter.items()))}")
    assert failures == [], "\n".join(failures[:20])
    assert sum(statuses.values()) == REQUESTS
    assert statuses[200] > REQUESTS // 10  # the valid ones really were answered
    assert statuses[413] == 0  # nothing sent was over the limit
    for session in app.registry._by_id.values():
        assert session.http_calls == 0
        assert session.in_flight == 0
