"""The in-process backend's prefix cache: reuse skips prefill work and never changes a result."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from model_proxy.backends._prefix_cache import CacheEntry, PrefixCache, common_prefix_length
from model_proxy.backends.transformers_backend import TransformersBackend
from model_proxy.models import GenerationRequest, SamplingParams
from polar_core.model_fixtures.tiny_model import build_tiny_model, teacher_forced_logprobs
from polar_core.model_fixtures.tokenizer import build_tiny_tokenizer

PROMPT = tuple(range(40, 70))  # 30 tokens: seven whole blocks of 4, then 2
BLOCK = 4


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer: Any) -> Any:
    return build_tiny_model(tokenizer, seed=0)


async def _started(model: Any, **kwargs: Any) -> TransformersBackend:
    backend = TransformersBackend(model, prefill_block=BLOCK, **kwargs)
    await backend.start()
    return backend


async def _call(
    backend: TransformersBackend, prompt: tuple[int, ...], *, seed: int = 5, temperature: float = 1.0, n: int = 8
) -> tuple[list[int], list[float]]:
    request = GenerationRequest(
        prompt_token_ids=prompt,
        sampling=SamplingParams(temperature=temperature, max_tokens=n, seed=seed),
        stop_token_ids=(),
        request_id="r",
    )
    chunks = [c async for c in backend.generate(request)]
    return [t for c in chunks for t in c.token_ids], [p for c in chunks for p in c.logprobs]


def test_common_prefix_length() -> None:
    assert common_prefix_length([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix_length([1, 2, 3], [1, 9, 3]) == 1
    assert common_prefix_length([], [1]) == 0
    long = list(range(5000))
    assert common_prefix_length(long, [*long[:3171], -1, *long[3172:]]) == 3171
    assert common_prefix_length(long, long) == 5000


async def test_agent_session_reuses_prefixes_with_bit_identical_results(model: Any) -> None:
    cached, fresh = await _started(model), await _started(model, prefix_cache=0)
    try:
        prompt = PROMPT
        for turn in range(4):
            got = await _call(cached, prompt, seed=turn)
            assert got == await _call(fresh, prompt, seed=turn)  # exactly, not approximately
            # The next call extends this one, as an agent's does: prompt, answer, a tool result.
            prompt = (*prompt, *got[0], 7, 8, 9 + turn)
        # The same prompt again and a prompt sharing only the first blocks.
        assert await _call(cached, prompt, seed=9) == await _call(fresh, prompt, seed=9)
        forked = (*PROMPT[:13], 99, *PROMPT[14:])
        assert await _call(cached, forked, seed=9) == await _call(fresh, forked, seed=9)
        assert cached._prefix.reused_tokens >= 4 * 28 + 12
        assert fresh._prefix.reused_tokens == 0
    finally:
        await cached.close()
        await fresh.close()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
async def test_reused_prefix_matches_a_full_forward(model: Any, temperature: float) -> None:
    backend = await _started(model)
    try:
        first, _ = await _call(backend, PROMPT, temperature=temperature)
        prompt = (*PROMPT, *first, 3, 4)
        ids, logprobs = await _call(backend, prompt, temperature=temperature, n=10)
        assert backend._prefix.reused_tokens > len(PROMPT) - BLOCK
        # One forward pass over prompt + answer: the same log-probabilities of the sampled tokens.
        assert logprobs == pytest.approx(teacher_forced_logprobs(model, prompt, ids, temperature), abs=1e-5)
        if temperature == 0.0:
            with torch.inference_mode():
                logits = model(input_ids=torch.tensor([[*prompt, *ids]])).logits[0]
            assert ids == logits[len(prompt) - 1 : -1].argmax(-1).tolist()
    finally:
        await backend.close()


async def test_a_failed_forward_pass_leaves_no_entry_behind(model: Any) -> None:
    backend, fresh = await _started(model), await _started(model, prefix_cache=0)
    layer = model.model.layers[1]
    calls = 0

    def fail_once(module: Any, args: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 9:  # in the middle of a decoding step, after layer 0 appended its keys and values
            raise RuntimeError("boom")

    try:
        await _call(backend, PROMPT)
        handle = layer.register_forward_pre_hook(fail_once)
        try:
            with pytest.raises(Exception, match="boom"):
                await _call(backend, (*PROMPT, 1, 2, 3, 4, 5))
        finally:
            handle.remove()
        prompt = (*PROMPT, 1, 2, 3, 4, 5)
        assert await _call(backend, prompt) == await _call(fresh, prompt)
    finally:
        await backend.close()
        await fresh.close()


async def test_an_abandoned_call_leaves_a_usable_entry(model: Any) -> None:
    backend, fresh = await _started(model), await _started(model, prefix_cache=0)
    try:
        request = GenerationRequest(
            prompt_token_ids=PROMPT,
            sampling=SamplingParams(max_tokens=200, seed=1),
            stop_token_ids=(),
            request_id="r",
            stream=True,
        )
        stream = backend.generate(request)
        first = await anext(stream)
        await stream.aclose()  # type: ignore[attr-defined]
        prompt = (*PROMPT, *first.token_ids, 6)
        reused = backend._prefix.reused_tokens
        assert await _call(backend, prompt) == await _call(fresh, prompt)
        assert backend._prefix.reused_tokens > reused
    finally:
        await backend.close()
        await fresh.close()


async def test_new_weights_drop_every_entry(tokenizer: Any, model: Any, tmp_path: Any) -> None:
    build_tiny_model(tokenizer, seed=1).save_pretrained(tmp_path / "b")
    backend = await _started(model)
    on_b = await _started(build_tiny_model(tokenizer, seed=1), prefix_cache=0)
    try:
        await _call(backend, PROMPT)
        assert len(backend._prefix) == 1
        await backend.load_weights(str(tmp_path / "b"))
        assert len(backend._prefix) == 0
        reused = backend._prefix.reused_tokens
        assert await _call(backend, PROMPT) == await _call(on_b, PROMPT)
        assert backend._prefix.reused_tokens == reused
    finally:
        await backend.close()
        await on_b.close()


def test_store_keeps_the_most_recent_entries_and_reuses_whole_aligned_blocks() -> None:
    class Cache:
        def __init__(self, n: int) -> None:
            self.n = n

        def get_seq_length(self) -> int:
            return self.n

        def crop(self, count: int) -> None:
            assert count < 0
            self.n += count

    store = PrefixCache(2, block=4)
    for start in (0, 100, 200):
        ids = list(range(start, start + 10))
        store.put(CacheEntry(Cache(10), ids, aligned=8))
    assert len(store) == 2
    assert store.take(list(range(0, 20))) is None  # evicted
    # Shares 10 IDs, 8 of them in whole blocks: cropped to 8.
    entry = store.take([*range(100, 110), 1, 2])
    assert entry is not None
    assert (entry.token_ids, entry.cache.n, entry.aligned) == (list(range(100, 108)), 8, 8)
    # Shares 6 IDs: one whole block of 4.
    entry = store.take([*range(200, 206), 0])
    assert entry is not None
    assert entry.token_ids == list(range(200, 204))
    assert len(store) == 0
    # A cache holding other than its IDs say is never fed from.
    store.put(CacheEntry(Cache(9), list(range(10)), aligned=8))
    assert store.take(list(range(20))) is None


def test_growing_layer_holds_what_a_dynamic_layer_holds() -> None:
    from transformers.cache_utils import DynamicLayer

    from model_proxy.backends._prefix_cache import _GrowingLayer

    torch.manual_seed(0)
    grown, plain = _GrowingLayer(), DynamicLayer()  # type: ignore[no-untyped-call]
    for step, n in enumerate((100, 130, 1, 1, 40, 200, 1)):  # crosses the first capacities (256, then more)
        k, v = torch.randn(1, 2, n, 8), torch.randn(1, 2, n, 8)
        got, want = grown.update(k, v), plain.update(k, v)
        assert torch.equal(got[0], want[0])
        assert torch.equal(got[1], want[1])
        if step == 3:
            grown.crop(-50)
            plain.crop(-50)
        assert grown.get_seq_length() == plain.get_seq_length()
