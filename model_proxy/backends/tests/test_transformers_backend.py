"""Unit tests of the in-process transformers backend against the reference sampler and teacher forcing."""

from __future__ import annotations

import math

import pytest
import torch

from model_proxy.backends.transformers_backend import TransformersBackend, sample_next
from model_proxy.errors import BackendUnavailable, ContextLengthExceeded, MalformedRequest
from model_proxy.models import GenerationChunk, GenerationRequest, SamplingParams
from polar_core.model_fixtures.tiny_model import (
    build_tiny_model,
    generate_with_logprobs,
    teacher_forced_logprobs,
)
from polar_core.model_fixtures.tokenizer import build_tiny_tokenizer

PROMPT = (5, 17, 200, 31, 9, 77)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_tiny_model(tokenizer, seed=0)


@pytest.fixture
async def backend(model):
    b = TransformersBackend(model, chunk_size=3)
    await b.start()
    yield b
    await b.close()


def _request(sampling: SamplingParams, *, stream: bool = False, stop=(), prompt=PROMPT) -> GenerationRequest:
    return GenerationRequest(
        prompt_token_ids=tuple(prompt), sampling=sampling, stop_token_ids=tuple(stop), request_id="r", stream=stream
    )


async def _run(backend: TransformersBackend, request: GenerationRequest) -> list[GenerationChunk]:
    return [c async for c in backend.generate(request)]


def _flat(chunks: list[GenerationChunk]) -> tuple[list[int], list[float]]:
    return [t for c in chunks for t in c.token_ids], [p for c in chunks for p in c.logprobs]


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
async def test_matches_reference_sampler_and_teacher_forcing(backend, model, temperature: float) -> None:
    sampling = SamplingParams(temperature=temperature, max_tokens=12, seed=1234)
    chunks = await _run(backend, _request(sampling))
    assert len(chunks) == 1
    ids, lps = _flat(chunks)
    ref_ids, ref_lps = generate_with_logprobs(
        model, PROMPT, max_new_tokens=12, temperature=temperature, seed=1234, eos_token_id=None
    )
    assert ids == ref_ids
    assert lps == pytest.approx(ref_lps, abs=1e-5)
    assert lps == pytest.approx(teacher_forced_logprobs(model, PROMPT, ids, temperature), abs=1e-4)
    assert chunks[-1].finish_reason == "length"


async def test_streams_several_chunks_with_same_result(backend) -> None:
    sampling = SamplingParams(max_tokens=10, seed=7)
    whole = _flat(await _run(backend, _request(sampling)))
    chunks = await _run(backend, _request(sampling, stream=True))
    assert len(chunks) >= 4
    assert all(len(c.token_ids) <= 3 for c in chunks)
    assert [c.finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert _flat(chunks) == whole


async def test_stops_on_stop_token(backend) -> None:
    sampling = SamplingParams(max_tokens=10, seed=3)
    ids, _ = _flat(await _run(backend, _request(sampling)))
    chunks = await _run(backend, _request(sampling, stop=(ids[3],)))
    got, _ = _flat(chunks)
    assert got == ids[: ids.index(ids[3]) + 1]
    assert chunks[-1].finish_reason == "stop"


async def test_top_k_one_is_greedy_but_reports_untruncated_logprob(backend, model) -> None:
    greedy = _flat(await _run(backend, _request(SamplingParams(temperature=0.0, max_tokens=6))))
    ids, lps = _flat(await _run(backend, _request(SamplingParams(temperature=1.0, top_k=1, max_tokens=6, seed=0))))
    assert ids == greedy[0]
    assert lps == pytest.approx(teacher_forced_logprobs(model, PROMPT, ids, 1.0), abs=1e-4)
    assert all(lp < 0 for lp in lps)


def test_top_p_keeps_smallest_prefix_reaching_mass() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    seen = set()
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        token, logprob = sample_next(logits, SamplingParams(top_p=0.8), generator)
        seen.add(token)
        assert logprob == pytest.approx(math.log([0.5, 0.3, 0.15, 0.05][token]), abs=1e-6)
    assert seen == {0, 1}


async def test_concurrent_calls_are_serialised_and_seeded(backend) -> None:
    import asyncio

    sampling = SamplingParams(max_tokens=8, seed=99)
    results = await asyncio.gather(*[_run(backend, _request(sampling, stream=s)) for s in (True, False, True)])
    flats = [_flat(r) for r in results]
    assert flats[0] == flats[1] == flats[2]


async def test_early_close_frees_the_model(backend) -> None:
    gen = backend.generate(_request(SamplingParams(max_tokens=200, seed=1), stream=True))
    first = await anext(gen)
    assert first.token_ids
    await gen.aclose()
    chunks = await _run(backend, _request(SamplingParams(max_tokens=2, seed=1)))
    assert len(_flat(chunks)[0]) == 2


async def test_errors(model) -> None:
    b = TransformersBackend(model, max_context=8)
    with pytest.raises(BackendUnavailable):
        await _run(b, _request(SamplingParams(max_tokens=1)))
    await b.start()
    try:
        with pytest.raises(ContextLengthExceeded):
            await _run(b, _request(SamplingParams(max_tokens=1), prompt=range(1, 10)))
        with pytest.raises(MalformedRequest):
            await _run(b, _request(SamplingParams(max_tokens=1), prompt=(10**9,)))
        with pytest.raises(MalformedRequest):
            await _run(b, _request(SamplingParams(max_tokens=1), prompt=()))
        # max_tokens is clamped to the room left in the context.
        chunks = await _run(b, _request(SamplingParams(max_tokens=50, seed=0)))
        assert len(_flat(chunks)[0]) == 2
        assert chunks[-1].finish_reason == "length"
    finally:
        await b.close()


async def test_loads_from_directory(tmp_path, model) -> None:
    model.save_pretrained(tmp_path)
    b = TransformersBackend(tmp_path)
    assert not await b.healthy()
    await b.start()
    try:
        assert await b.healthy()
        sampling = SamplingParams(max_tokens=5, seed=11)
        ids, lps = _flat(await _run(b, _request(sampling)))
        ref = generate_with_logprobs(model, PROMPT, max_new_tokens=5, temperature=1.0, seed=11, eos_token_id=None)
        assert ids == ref[0]
        assert lps == pytest.approx(ref[1], abs=1e-5)
    finally:
        await b.close()
