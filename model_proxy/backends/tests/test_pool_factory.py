"""Unit tests of the replica pool and the backend factory."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from model_proxy.backends import (
    Backend,
    BackendPool,
    ScriptedBackend,
    SGLangBackend,
    TransformersBackend,
    TritonBackend,
    VLLMBackend,
    create_backend,
)
from model_proxy.errors import BackendOverloaded, BackendUnavailable
from model_proxy.models import GenerationChunk, GenerationRequest, SamplingParams
from polar_core.errors import FailedPrecondition, InvalidArgument


class _Fake:
    name = "fake"

    def __init__(self, label: str, *, fail: Exception | None = None, fail_after_first: bool = False) -> None:
        self.label = label
        self.fail = fail
        self.fail_after_first = fail_after_first
        self.up = True
        self.calls = 0
        self.gate: asyncio.Event | None = None
        self.loaded: list[str] = []
        self.load_error: Exception | None = None

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        self.calls += 1
        if self.fail is not None and not self.fail_after_first:
            raise self.fail
        if self.gate is not None:
            await self.gate.wait()
        yield GenerationChunk((ord(self.label),), (-1.0,), None)
        if self.fail is not None:
            raise self.fail
        yield GenerationChunk((), (), "stop")

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def healthy(self) -> bool:
        return self.up

    async def check_weights(self, path: str) -> str:
        return f"{self.label}:{path}"

    async def load_weights(self, path: str) -> None:
        if self.load_error is not None:
            raise self.load_error
        self.loaded.append(path)


async def test_pool_checks_and_loads_weights_on_every_replica() -> None:
    a, b = _Fake("a"), _Fake("b")
    pool = BackendPool([a, b])
    assert await pool.check_weights("/ckpt") == "a:/ckpt"
    await pool.load_weights("/ckpt")
    assert a.loaded == b.loaded == ["/ckpt"]


async def test_a_replica_that_fails_to_load_leaves_rotation_until_a_load_reaches_it() -> None:
    a, b = _Fake("a"), _Fake("b")
    pool = BackendPool([a, b])
    b.load_error = FailedPrecondition("reload failed")
    await pool.load_weights("/v1")  # a serves /v1; b still has the old weights and must not be called
    assert (a.loaded, b.loaded) == (["/v1"], [])
    assert {await _labels(pool, f"s{i}") for i in range(8)} == {"a"}
    a.load_error = FailedPrecondition("disk full")
    with pytest.raises(FailedPrecondition, match=r"no fake replica loaded '/v2': replica 0: disk full; replica 1"):
        await pool.load_weights("/v2")
    a.load_error = b.load_error = None
    await pool.load_weights("/v3")
    assert {await _labels(pool, f"s{i}") for i in range(8)} == {"a", "b"}


def _request(key: str = "") -> GenerationRequest:
    return GenerationRequest((1, 2), SamplingParams(max_tokens=4), (7,), "r", affinity_key=key)


async def _labels(pool: BackendPool, key: str = "") -> str:
    return "".join(chr(t) for c in [c async for c in pool.generate(_request(key))] for t in c.token_ids)


async def test_affinity_is_sticky_and_spreads_sessions() -> None:
    replicas = [_Fake(x) for x in "abcd"]
    pool = BackendPool(replicas)
    assert isinstance(pool, Backend)
    chosen = {key: await _labels(pool, key) for key in (f"session-{i}" for i in range(40))}
    for key, label in chosen.items():
        assert await _labels(pool, key) == label
    assert len(set(chosen.values())) == 4
    # Removing a replica moves only its sessions (consistent hashing).
    smaller = BackendPool([r for r in replicas if r.label != "d"])
    for key, label in chosen.items():
        if label != "d":
            assert await _labels(smaller, key) == label


async def test_unhealthy_replica_falls_back_and_returns() -> None:
    replicas = [_Fake(x) for x in "ab"]
    pool = BackendPool(replicas, unhealthy_retry_s=60)
    key = next(k for k in (f"s{i}" for i in range(100)) if pool.ranking(k)[0] == 0)
    assert await _labels(pool, key) == "a"
    replicas[0].up = False
    assert await pool.healthy()
    assert await _labels(pool, key) == "b"
    replicas[0].up = True
    await pool.healthy()
    assert await _labels(pool, key) == "a"


async def test_unavailable_before_first_chunk_fails_over_but_not_after() -> None:
    down = _Fake("a", fail=BackendUnavailable("down"))
    pool = BackendPool([down, _Fake("b")])
    key = next(k for k in (f"s{i}" for i in range(100)) if pool.ranking(k)[0] == 0)
    assert await _labels(pool, key) == "b"
    assert down.calls == 1

    midway = _Fake("a", fail=BackendUnavailable("died"), fail_after_first=True)
    pool = BackendPool([midway, _Fake("b")])
    key = next(k for k in (f"s{i}" for i in range(100)) if pool.ranking(k)[0] == 0)
    with pytest.raises(BackendUnavailable, match="died"):
        await _labels(pool, key)

    all_down = BackendPool([_Fake("a", fail=BackendUnavailable("x")), _Fake("b", fail=BackendUnavailable("y"))])
    with pytest.raises(BackendUnavailable, match="all 2"):
        await _labels(all_down)

    overloaded = BackendPool([_Fake("a", fail=BackendOverloaded("busy")), _Fake("b")])
    key = next(k for k in (f"s{i}" for i in range(100)) if overloaded.ranking(k)[0] == 0)
    with pytest.raises(BackendOverloaded):
        await _labels(overloaded, key)


async def test_keyless_calls_go_to_least_in_flight() -> None:
    replicas = [_Fake(x) for x in "abc"]
    gate = asyncio.Event()
    for r in replicas:
        r.gate = gate
    pool = BackendPool(replicas)
    tasks = [asyncio.create_task(_labels(pool)) for _ in range(3)]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert pool.in_flight == [1, 1, 1]
    gate.set()
    assert sorted(await asyncio.gather(*tasks)) == ["a", "b", "c"]
    assert pool.in_flight == [0, 0, 0]


def test_pool_needs_a_replica() -> None:
    with pytest.raises(ValueError, match="replica"):
        BackendPool([])


def test_factory_builds_each_kind(tmp_path: Path) -> None:
    assert isinstance(create_backend("vllm", {"url": "http://h:1"}, None), VLLMBackend)
    assert isinstance(create_backend("sglang", {"url": "http://h:1"}, None), SGLangBackend)
    triton = create_backend("triton", {"url": "h:1", "tensor_names": {"top_k": "top_k"}}, None)
    assert isinstance(triton, TritonBackend)
    pool = create_backend("vllm", {"urls": "http://h:1, http://h:2"}, None)
    assert isinstance(pool, BackendPool)
    assert [r.base_url for r in pool.replicas] == ["http://h:1", "http://h:2"]  # type: ignore[attr-defined]
    assert isinstance(create_backend("transformers", {"model_dir": str(tmp_path)}, None), TransformersBackend)
    script = tmp_path / "s.jsonl"
    script.write_text(json.dumps({"token_ids": [1, 2]}) + "\n")
    scripted = create_backend("scripted", {"script": str(script), "end_of_turn_id": 7}, None)
    assert isinstance(scripted, ScriptedBackend)
    assert scripted.remaining("any") == 1
    sessions = create_backend(
        "scripted", {"sessions": {"s1": [{"token_ids": [3]}], "s2": str(script)}, "end_of_turn_id": 7}, None
    )
    assert isinstance(sessions, ScriptedBackend)
    assert sessions.remaining("s1") == 1
    assert sessions.remaining("unknown") == 0


def test_factory_builds_transformers_from_loaded_weights_with_the_same_options() -> None:
    weights = object()  # started lazily: the backend only keeps the object here
    backend = create_backend("transformers", {"chunk_size": 2, "device": "cpu"}, None, weights=weights)
    assert isinstance(backend, TransformersBackend)
    with pytest.raises(InvalidArgument, match="unhealthy_retry_s"):
        create_backend("transformers", {"unhealthy_retry_s": 1}, None, weights=weights)


@pytest.mark.parametrize(
    ("name", "options", "match"),
    [
        ("nope", {}, "unknown backend"),
        ("vllm", {}, "url"),
        ("vllm", {"url": "http://h", "modle": "x"}, "modle"),
        ("transformers", {}, "model_dir"),
        ("transformers", {"model_dir": "/m", "chunk_size": "four"}, "chunk_size"),
        ("vllm", {"url": "http://h", "timeout_s": "soon"}, "timeout_s"),
        ("triton", {"url": "h:1", "tensor_names": {"top_q": "x"}}, "tensor_names"),
        ("scripted", {"end_of_turn_id": 1}, "script"),
        ("scripted", {"turns": [{"text": "a"}]}, "end_of_turn_id"),
        ("scripted", {"turns": [{"bad": 1}], "end_of_turn_id": 1}, "bad turns"),
    ],
)
def test_factory_refuses_bad_options(name: str, options: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        create_backend(name, options, None)
