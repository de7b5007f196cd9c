"""Weight updates through a real vLLM CPU server behind a real model proxy.

One server (``VLLM_SERVER_DEV_MODE=1``, which mounts ``/pause``, ``/collective_rpc`` and the other weight-update
endpoints) serves an *untied* tiny model A; the proxy samples through it with the official ``openai`` SDK,
the backend loads B, and the next recorded call's log-probabilities must equal B's teacher-forced ones. A
checkpoint of another architecture is refused before anything reaches the server, which keeps serving.
"""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest
import torch
from polar.proxy.v1 import model_proxy_service_pb2 as pb
from polar.proxy.v1 import model_proxy_service_pb2_grpc as pb_grpc
from transformers import AutoModelForCausalLM, Qwen2ForCausalLM

from integration_tests.support.backends import backend_venv_python, run_vllm
from model_proxy.app import ProxyApp
from model_proxy.backends.factory import create_backend
from model_proxy.ports import Backend
from model_proxy.server import start_server
from model_proxy.settings import ProxySettings
from polar_core.errors import FailedPrecondition
from polar_core.model_fixtures.cache import save_tiny_model
from polar_core.model_fixtures.tiny_model import teacher_forced_logprobs, tiny_model_config
from polar_core.model_fixtures.tokenizer import build_tiny_tokenizer
from polar_core.server import RunningService

VENV_PYTHON = backend_venv_python("vllm")

pytestmark = [
    pytest.mark.skipif(VENV_PYTHON is None, reason="no .venv-vllm: run scripts/setup_backends.sh vllm"),
    pytest.mark.slow,
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("weights")
    out = {
        "a": save_tiny_model(root / "a", seed=0, tie_word_embeddings=False),
        "b": save_tiny_model(root / "b", seed=1, tie_word_embeddings=False),
        "tied": save_tiny_model(root / "tied", seed=1),
    }
    tokenizer = build_tiny_tokenizer()
    raw = tiny_model_config(tokenizer, tie_word_embeddings=False).to_dict()
    raw.update(num_hidden_layers=1, layer_types=raw["layer_types"][:1])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(2)
        Qwen2ForCausalLM(type(tiny_model_config(tokenizer)).from_dict(raw)).save_pretrained(root / "shallow")
    out["shallow"] = root / "shallow"
    return out


@pytest.fixture(scope="module")
def vllm_url(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    assert VENV_PYTHON is not None
    log = tmp_path_factory.mktemp("vllm-log") / "server.log"
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    with run_vllm(VENV_PYTHON, checkpoints["a"], log, max_model_len=512, env=env, timeout_s=900) as (url, startup_s):
        print(f"vllm started in {startup_s:.1f} s", file=sys.stderr)
        yield url


class Proxy:
    """A started proxy over the vLLM backend, its gRPC stub and an ``openai`` client factory."""

    def __init__(self, running: RunningService[ProxyApp], channel: grpc.aio.Channel, backend: Backend) -> None:
        self.running = running
        self.channel = channel
        self.stub: Any = pb_grpc.ModelProxyServiceStub(channel)
        self.backend = backend

    async def sample(self, session_id: str) -> Any:
        """One chat call through the SDK; returns its record."""
        opened = await self.stub.OpenSession(pb.OpenSessionRequest(session_id=session_id, model="policy"))
        async with openai.AsyncOpenAI(
            base_url=opened.openai_base_url, api_key=opened.session_token, max_retries=0
        ) as client:
            await client.chat.completions.create(
                model="policy",
                messages=[{"role": "user", "content": "count to ten"}],
                max_tokens=24,
                temperature=1.0,
            )
        reply = await self.stub.ListCompletions(pb.ListCompletionsRequest(session_id=session_id))
        (record,) = reply.completions
        return record

    async def update(self, path: Path) -> float:
        """Pause the proxy, load ``path`` through the backend, resume; returns the load's seconds."""
        await self.stub.PauseGeneration(pb.PauseGenerationRequest())
        try:
            start = time.perf_counter()
            await self.backend.load_weights(str(path))
            return time.perf_counter() - start
        finally:
            await self.stub.ResumeGeneration(pb.ResumeGenerationRequest())


@pytest.fixture
async def proxy(vllm_url: str, checkpoints: dict[str, Path], tmp_path: Path) -> AsyncIterator[Proxy]:
    tokenizer = build_tiny_tokenizer()
    options = {"url": vllm_url, "model": "tiny", "model_dir": str(checkpoints["a"])}
    backend = create_backend("vllm", options, tokenizer)
    settings = ProxySettings(state_dir=tmp_path / "proxy", fsync=False, context_length=512)
    running = await start_server(settings, backend=backend, tokenizer=tokenizer)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
    try:
        yield Proxy(running, channel, backend)
    finally:
        await channel.close(None)
        await running.stop(None)


def _model(path: Path) -> Any:
    model: Any = AutoModelForCausalLM.from_pretrained(path)
    return model.eval()


def _distance(model: Any, record: Any) -> float:
    expected = teacher_forced_logprobs(model, list(record.prompt_token_ids), list(record.response_token_ids))
    return float(max(abs(a - b) for a, b in zip(record.response_logprobs, expected, strict=True)))


@pytest.mark.timeout(1200)
async def test_load_weights_moves_sampling_to_the_new_checkpoint(proxy: Proxy, checkpoints: dict[str, Path]) -> None:
    model_a, model_b = _model(checkpoints["a"]), _model(checkpoints["b"])
    assert await proxy.backend.check_weights(str(checkpoints["b"])) == "Qwen2ForCausalLM"

    before = await proxy.sample("before")
    assert len(before.response_token_ids) > 0
    assert _distance(model_a, before) < 1e-4

    seconds = [await proxy.update(checkpoints["b"])]
    after = await proxy.sample("after")
    assert _distance(model_b, after) < 1e-4
    assert _distance(model_a, after) > 1e-2

    # Back and forth: every update lands, and each is timed for docs/backends.md.
    seconds.append(await proxy.update(checkpoints["a"]))
    assert _distance(model_a, await proxy.sample("again-a")) < 1e-4
    seconds.append(await proxy.update(checkpoints["b"]))
    assert _distance(model_b, await proxy.sample("again-b")) < 1e-4
    print(f"vllm seconds per update (tiny model): {[round(s, 3) for s in seconds]}", file=sys.stderr)


@pytest.mark.timeout(1200)
async def test_unfit_checkpoints_are_refused_and_the_server_keeps_serving(
    proxy: Proxy, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    await proxy.update(checkpoints["b"])
    model_b = _model(checkpoints["b"])
    cases = [
        (checkpoints["shallow"], r"num_hidden_layers 1 \(served: 2\)"),
        (checkpoints["tied"], "tie_word_embeddings True"),
        (tmp_path / "missing", "is not a directory"),
    ]
    for path, message in cases:
        with pytest.raises(FailedPrecondition, match=message):
            await proxy.backend.check_weights(str(path))
        with pytest.raises(FailedPrecondition, match=message):
            await proxy.update(path)
    assert await proxy.backend.healthy()
    assert _distance(model_b, await proxy.sample("still-b")) < 1e-4
