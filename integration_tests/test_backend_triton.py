"""The Triton backend against a real Triton server (PyTriton's bundled tritonserver) serving the tiny model.

The server runs from ``.venv-triton`` (``scripts/setup_backends.sh triton``) and speaks TensorRT-LLM's tensor
names; the test is skipped, saying so, when that environment is missing.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from integration_tests.support.backends import backend_venv_python, free_ports, run_pytriton
from model_proxy.backends.triton import TritonBackend
from model_proxy.errors import BackendUnavailable
from model_proxy.models import GenerationChunk, GenerationRequest, SamplingParams
from polar_core.model_fixtures.cache import save_tiny_model
from polar_core.model_fixtures.tiny_model import generate_with_logprobs, teacher_forced_logprobs

VENV_PYTHON = backend_venv_python("triton")
PROMPT = (5, 17, 200, 31, 9, 77)

pytestmark = [
    pytest.mark.skipif(VENV_PYTHON is None, reason="no .venv-triton: run scripts/setup_backends.sh triton"),
    pytest.mark.slow,
]


@pytest.fixture(scope="module")
def triton_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    assert VENV_PYTHON is not None
    model_dir = save_tiny_model(tmp_path_factory.mktemp("tiny-model"))
    log = tmp_path_factory.mktemp("triton-log") / "server.log"
    with run_pytriton(VENV_PYTHON, model_dir, log) as (url, startup_s):
        print(f"triton started in {startup_s:.1f} s", file=sys.stderr)
        yield url


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(save_tiny_model(tmp_path_factory.mktemp("tiny-ref")))
    return model.eval()


def _request(stream: bool, *, seed: int = 21, max_tokens: int = 10, stop=()) -> GenerationRequest:
    return GenerationRequest(
        prompt_token_ids=PROMPT,
        sampling=SamplingParams(max_tokens=max_tokens, seed=seed),
        stop_token_ids=tuple(stop),
        request_id="call-1",
        stream=stream,
    )


async def _run(backend: TritonBackend, request: GenerationRequest) -> list[GenerationChunk]:
    return [chunk async for chunk in backend.generate(request)]


def _flat(chunks: list[GenerationChunk]) -> tuple[list[int], list[float]]:
    return [t for c in chunks for t in c.token_ids], [p for c in chunks for p in c.logprobs]


@pytest.mark.timeout(480)  # includes the module's server start: up to two attempts of 180 s
async def test_unary_matches_reference_and_teacher_forcing(triton_url: str, tiny) -> None:
    backend = TritonBackend(triton_url, "tiny")
    await backend.start()
    try:
        assert await backend.healthy()
        chunks = await _run(backend, _request(stream=False))
        ids, lps = _flat(chunks)
        ref_ids, ref_lps = generate_with_logprobs(
            tiny, PROMPT, max_new_tokens=10, temperature=1.0, seed=21, eos_token_id=None
        )
        assert ids == ref_ids
        assert lps == pytest.approx(ref_lps, abs=1e-4)
        assert lps == pytest.approx(teacher_forced_logprobs(tiny, PROMPT, ids), abs=1e-4)
        assert chunks[-1].finish_reason == "length"

        stopped = _flat(await _run(backend, _request(stream=False, stop=(ids[2],))))[0]
        assert stopped == ids[: ids.index(ids[2]) + 1]
    finally:
        await backend.close()


@pytest.mark.timeout(180)
async def test_decoupled_streaming_matches_unary(triton_url: str, tiny) -> None:
    unary = TritonBackend(triton_url, "tiny")
    streaming = TritonBackend(triton_url, "tiny_stream", decoupled=True)
    await unary.start()
    await streaming.start()
    try:
        expected = _flat(await _run(unary, _request(stream=False, seed=5)))
        chunks = await _run(streaming, _request(stream=True, seed=5))
        assert len(chunks) == 10
        assert [c.finish_reason for c in chunks] == [None] * 9 + ["length"]
        ids, lps = _flat(chunks)
        assert ids == expected[0]
        assert lps == pytest.approx(expected[1], abs=1e-5)
        assert lps == pytest.approx(teacher_forced_logprobs(tiny, PROMPT, ids), abs=1e-4)

        # A stop ID ends the stream; the decoupled model also answers non-streaming calls in one response.
        stop = ids[3]
        chunks = await _run(streaming, _request(stream=True, seed=5, stop=(stop, 99999)))
        assert _flat(chunks)[0] == ids[: ids.index(stop) + 1]
        assert chunks[-1].finish_reason == "stop"
        whole = await _run(streaming, _request(stream=False, seed=5))
        assert len(whole) == 1
        assert _flat(whole)[0] == ids
    finally:
        await unary.close()
        await streaming.close()


@pytest.mark.timeout(60)
async def test_unknown_model_and_dead_server_are_unavailable(triton_url: str) -> None:
    backend = TritonBackend(triton_url, "no-such-model")
    await backend.start()
    try:
        assert not await backend.healthy()
        with pytest.raises(BackendUnavailable):
            await _run(backend, _request(stream=False))
    finally:
        await backend.close()
    (port,) = free_ports(1)
    dead = TritonBackend(f"127.0.0.1:{port}", "tiny", timeout_s=5.0)
    await dead.start()
    try:
        assert not await dead.healthy()
        with pytest.raises(BackendUnavailable):
            await _run(dead, _request(stream=False))
    finally:
        await dead.close()
