"""Fixtures of the proxy's unit tests: the tiny tokenizer, a controllable fake backend, an in-process app."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from model_proxy.app import ProxyApp
from model_proxy.models import GenerationChunk, GenerationRequest
from model_proxy.settings import ProxySettings
from polar_core.model_fixtures import build_tiny_tokenizer


class FakeBackend:
    """Answers every call with the next text of ``replies`` (tokenised, end-of-turn appended).

    ``error`` is raised instead when set; ``hold`` (an Event) makes each call wait before its last chunk.
    ``load_error`` makes CheckWeights/LoadWeights fail; ``loaded`` lists the paths loaded.
    """

    name = "fake"

    def __init__(self, tokenizer: Any, replies: list[str] | None = None, *, chunk_size: int = 3) -> None:
        self.tok = tokenizer
        self.eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.replies = list(replies or ["Hello there."])
        self.chunk_size = chunk_size
        self.error: Exception | None = None
        self.hold: asyncio.Event | None = None
        self.requests: list[GenerationRequest] = []
        self.calls = 0
        self.load_error: Exception | None = None
        self.loaded: list[str] = []

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        self.requests.append(request)
        if self.error is not None:
            raise self.error
        text = self.replies[self.calls % len(self.replies)]
        self.calls += 1
        ids = [*self.tok.encode(text, add_special_tokens=False), self.eot]
        limit = request.sampling.max_tokens or len(ids)
        finish = "stop" if len(ids) <= limit else "length"
        ids = ids[:limit]
        step = self.chunk_size if request.stream else len(ids)
        for start in range(0, len(ids), step):
            part = ids[start : start + step]
            last = start + step >= len(ids)
            if last and self.hold is not None:
                await self.hold.wait()
            yield GenerationChunk(
                tuple(part), tuple(-0.5 - 0.01 * (start + i) for i in range(len(part))), finish if last else None
            )

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def healthy(self) -> bool:
        return True

    async def check_weights(self, path: str) -> str:
        if self.load_error is not None:
            raise self.load_error
        return "FakeForCausalLM"

    async def load_weights(self, path: str) -> None:
        await self.check_weights(path)
        self.loaded.append(path)


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    return build_tiny_tokenizer()


@pytest.fixture
def backend(tokenizer: Any) -> FakeBackend:
    return FakeBackend(tokenizer)


@pytest.fixture
def make_app(tmp_path: Path, tokenizer: Any) -> Callable[..., ProxyApp]:
    def make(backend: Any, **overrides: Any) -> ProxyApp:
        settings = ProxySettings(state_dir=tmp_path, fsync=False, gc_freeze=False, **overrides)
        return ProxyApp(settings, backend, tokenizer)

    return make


@pytest.fixture
def app(make_app: Callable[..., ProxyApp], backend: FakeBackend) -> ProxyApp:
    return make_app(backend)


@pytest.fixture
async def client(app: ProxyApp) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app.http.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as c:
        yield c


@pytest.fixture
async def token(app: ProxyApp) -> str:
    _, tok = await app.registry.open("s1", "policy")
    return tok
