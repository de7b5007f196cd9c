"""The vLLM backend against a real vLLM CPU server serving the tiny model (token IDs in and out).

The server runs from ``.venv-vllm`` (``scripts/setup_backends.sh vllm``) with ``--logprobs-mode
processed_logprobs`` and float32 weights; the test is skipped, saying so, when that environment is missing.
Start-up takes 1-2 minutes on two cores, so every test shares one server.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from integration_tests.support.backends import backend_venv_python, free_ports, run_vllm
from model_proxy.backends.vllm import VLLMBackend
from model_proxy.errors import BackendUnavailable, ContextLengthExceeded
from model_proxy.models import GenerationChunk, GenerationRequest, SamplingParams
from polar_core.model_fixtures.cache import save_tiny_model
from polar_core.model_fixtures.tiny_model import teacher_forced_logprobs

VENV_PYTHON = backend_venv_python("vllm")
PROMPT = (5, 17, 200, 31, 9, 77)
MAX_MODEL_LEN = 512

pytestmark = [
    pytest.mark.skipif(VENV_PYTHON is None, reason="no .venv-vllm: run scripts/setup_backends.sh vllm"),
    pytest.mark.slow,
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="module")
def vllm_url(model_dir, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    assert VENV_PYTHON is not None
    log = tmp_path_factory.mktemp("vllm-log") / "server.log"
    with run_vllm(VENV_PYTHON, model_dir, log, max_model_len=MAX_MODEL_LEN) as (url, startup_s):
        print(f"vllm started in {startup_s:.1f} s", file=sys.stderr)
        yield url


@pytest.fixture(scope="module")
def tiny(model_dir):
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir)
    return model.eval()


def _request(stream: bool, *, temperature: float = 1.0, max_tokens: int = 12, stop=(), prompt=PROMPT, seed=4):
    return GenerationRequest(
        prompt_token_ids=tuple(prompt),
        sampling=SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed),
        stop_token_ids=tuple(stop),
        request_id="call-1",
        stream=stream,
    )


async def _run(backend: VLLMBackend, request: GenerationRequest) -> list[GenerationChunk]:
    return [chunk async for chunk in backend.generate(request)]


def _flat(chunks: list[GenerationChunk]) -> tuple[list[int], list[float]]:
    return [t for c in chunks for t in c.token_ids], [p for c in chunks for p in c.logprobs]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_ids_and_logprobs_match_teacher_forcing(vllm_url: str, tiny, temperature: float) -> None:
    backend = VLLMBackend(vllm_url)
    await backend.start()
    try:
        assert await backend.healthy()
        chunks = await _run(backend, _request(stream=False, temperature=temperature))
        assert len(chunks) == 1
        ids, lps = _flat(chunks)
        assert len(ids) == 12
        assert chunks[0].finish_reason == "length"
        expected = teacher_forced_logprobs(tiny, PROMPT, ids, temperature)
        assert lps == pytest.approx(expected, abs=2e-3)
    finally:
        await backend.close()


@pytest.mark.timeout(400)
async def test_streaming_and_stop_ids(vllm_url: str, tiny) -> None:
    backend = VLLMBackend(vllm_url, model="tiny")
    await backend.start()
    try:
        whole = _flat(await _run(backend, _request(stream=False)))
        chunks = await _run(backend, _request(stream=True))
        assert len(chunks) > 1
        assert chunks[-1].finish_reason == "length"
        assert all(c.finish_reason is None for c in chunks[:-1])
        ids, lps = _flat(chunks)
        assert ids == whole[0]  # same seed, same sample
        assert lps == pytest.approx(whole[1], abs=1e-5)

        stop = ids[4]
        chunks = await _run(backend, _request(stream=True, stop=(stop,)))
        got, got_lps = _flat(chunks)
        assert got == ids[: ids.index(stop) + 1]  # the sampled stop ID is returned with its logprob
        assert chunks[-1].finish_reason == "stop"
        assert got_lps == pytest.approx(teacher_forced_logprobs(tiny, PROMPT, got), abs=2e-3)

        # Concurrent calls are fine.
        results = await asyncio.gather(*[_run(backend, _request(stream=s, seed=9)) for s in (True, False)])
        assert _flat(results[0])[0] == _flat(results[1])[0]
    finally:
        await backend.close()


@pytest.mark.timeout(400)
async def test_errors_are_mapped(vllm_url: str) -> None:
    backend = VLLMBackend(vllm_url, model="tiny")
    await backend.start()
    try:
        with pytest.raises(ContextLengthExceeded) as info:
            await _run(backend, _request(stream=False, prompt=[5] * (MAX_MODEL_LEN + 10), max_tokens=4))
        assert info.value.limit == MAX_MODEL_LEN
        with pytest.raises(ContextLengthExceeded):
            await _run(backend, _request(stream=True, max_tokens=MAX_MODEL_LEN * 2))
    finally:
        await backend.close()
    (port,) = free_ports(1)
    dead = VLLMBackend(f"http://127.0.0.1:{port}", model="tiny")
    await dead.start()
    try:
        assert not await dead.healthy()
        with pytest.raises(BackendUnavailable):
            await _run(dead, _request(stream=False))
    finally:
        await dead.close()
