"""The llama_cpp backend against the real ``llama-cpp-cffi`` CPU module and the wheel's Q4_1 GGUF of SmolLM2.

Tolerances. The float32 policy *is* the de-quantised Q4_1 file, yet llama.cpp rounds activations to 8 bits for
its Q4_1 dot products, and its attention kernels depend on how many KV cells a step spans (a padded window over
every sequence's cells), so its logits move with the batch's composition too. Measured on these prompts: against
float32 teacher forcing, per-token gaps up to 0.34 nats (docs/backends.md: mean 0.068, max 0.33 over 128
tokens); one call alone against the same call batched with three others, up to 0.28 nats, with the same greedy
tokens (against float32 greedy decoding, the first 9 of 16 the same, then a near tie). Hence greedy IDs compared
over the first tokens, log-probabilities within 0.6 nats per token and 0.15 on average; a call compared with
itself (same seed, same slot state) is exact.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from model_proxy.backends import create_backend, parse_options
from model_proxy.backends._llama_cpp_lib import llama_cpp_missing
from model_proxy.backends.transformers_backend import sample_next
from model_proxy.errors import BackendUnavailable, ContextLengthExceeded, MalformedRequest
from model_proxy.models import GenerationChunk, GenerationRequest, SamplingParams
from polar_core.errors import FailedPrecondition, InvalidArgument

_MISSING = llama_cpp_missing()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"llama-cpp-cffi is not importable: {_MISSING}")

# "<|im_start|>system\n...<|im_end|>\n<|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n", tokenised.
PROMPT: tuple[int, ...] = (1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018)
PROMPT += (411, 407, 19712, 8182, 2, 198, 1, 4093, 198, 22503, 17, 2, 198, 1, 520, 9531, 198)
# "... user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
FRANCE = (*PROMPT[:24], 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198)
MAX_GAP = 0.6
MEAN_GAP = 0.15


def _gguf() -> Any:
    from polar_core.default_model import smollm2_gguf_path

    return smollm2_gguf_path()


def _make(**options: Any) -> Any:
    from model_proxy.backends.llama_cpp import LlamaCppBackend

    return LlamaCppBackend(_gguf(), **{"threads": 1, "slots": 4, "max_context": 512, **options})


@pytest.fixture
async def backend() -> AsyncIterator[Any]:
    b = _make()
    await b.start()
    yield b
    await b.close()


@pytest.fixture(scope="module")
def hf_model() -> Any:
    from polar_core.default_model import load_smollm2

    return load_smollm2()[1]


@pytest.fixture(scope="module")
def checkpoint(hf_model: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The float32 policy (the de-quantised GGUF) as a Hugging Face checkpoint directory.

    ``save_pretrained`` refuses a model loaded from GGUF, so the state dict and config are written directly.
    """
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("checkpoint")
    state = {k: v.contiguous() for k, v in hf_model.state_dict().items() if k != "lm_head.weight"}  # tied
    save_file(state, str(folder / "model.safetensors"))
    hf_model.config.save_pretrained(folder)
    return folder


def _request(
    prompt: tuple[int, ...] = PROMPT, *, stop: tuple[int, ...] = (), stream: bool = False, **sampling: Any
) -> GenerationRequest:
    return GenerationRequest(
        prompt_token_ids=prompt, sampling=SamplingParams(**sampling), stop_token_ids=stop, request_id="r", stream=stream
    )


async def _run(backend: Any, request: GenerationRequest) -> tuple[list[int], list[float], str | None]:
    chunks: list[GenerationChunk] = [c async for c in backend.generate(request)]
    return [t for c in chunks for t in c.token_ids], [p for c in chunks for p in c.logprobs], chunks[-1].finish_reason


def _close(a: list[float], b: list[float]) -> None:
    gaps = np.abs(np.array(a) - np.array(b))
    assert gaps.max() < MAX_GAP, gaps
    assert gaps.mean() < MEAN_GAP, gaps


def _hf_greedy_agrees(model: Any, prompt: tuple[int, ...], ids: list[int]) -> int:
    """How many of ``ids`` float32 greedy decoding would also pick, in order (one teacher-forced pass)."""
    with torch.inference_mode():
        picks = model(torch.tensor([list(prompt) + ids])).logits[0, len(prompt) - 1 :].argmax(dim=-1).tolist()
    agree = 0
    while agree < len(ids) and picks[agree] == ids[agree]:
        agree += 1
    return agree


def _teacher_forced(model: Any, prompt: tuple[int, ...], ids: list[int]) -> list[float]:
    with torch.inference_mode():
        logits = model(torch.tensor([list(prompt) + ids])).logits[0].float()
    log_probs = torch.log_softmax(logits, dim=-1)
    return [float(log_probs[len(prompt) - 1 + i, t]) for i, t in enumerate(ids)]


@pytest.mark.timeout(300)  # loads the float32 policy (15-25 s on two busy cores)
async def test_greedy_ids_and_logprobs_agree_with_the_float32_policy(backend: Any, hf_model: Any) -> None:
    ids, logprobs, finish = await _run(backend, _request(temperature=0.0, max_tokens=16))
    assert finish == "length"
    assert len(ids) == 16
    # Later tokens may part at a near tie (here the tenth, by 0.1 nats): the rounding above is enough.
    assert _hf_greedy_agrees(hf_model, PROMPT, ids) >= 8
    _close(logprobs, _teacher_forced(hf_model, PROMPT, ids))


@pytest.mark.timeout(300)
async def test_sampled_logprobs_agree_with_the_float32_policy_and_repeat_with_a_seed(
    backend: Any, hf_model: Any
) -> None:
    first = await _run(backend, _request(temperature=0.8, max_tokens=16, seed=11))
    again = await _run(backend, _request(temperature=0.8, max_tokens=16, seed=11))
    assert again == first
    reference = [lp * 1.0 for lp in _teacher_forced_scaled(hf_model, PROMPT, first[0], 0.8)]
    _close(first[1], reference)


def _teacher_forced_scaled(model: Any, prompt: tuple[int, ...], ids: list[int], temperature: float) -> list[float]:
    with torch.inference_mode():
        logits = model(torch.tensor([list(prompt) + ids])).logits[0].float() / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    return [float(log_probs[len(prompt) - 1 + i, t]) for i, t in enumerate(ids)]


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=5),
        SamplingParams(temperature=1.3, top_p=0.6),
        SamplingParams(temperature=1.0, top_k=40, top_p=0.9),
    ],
)
def test_sample_logits_follows_the_transformers_sampler(sampling: SamplingParams) -> None:
    from model_proxy.backends.llama_cpp import sample_logits

    logits = np.random.default_rng(3).normal(0.0, 3.0, size=500).astype(np.float32)
    reference = torch.log_softmax(torch.from_numpy(logits) / (sampling.temperature or 1.0), dim=-1)
    support = _support(reference.exp().numpy(), sampling)
    generator = torch.Generator().manual_seed(0)
    assert {sample_next(torch.from_numpy(logits), sampling, generator)[0] for _ in range(300)} <= support
    rng = np.random.default_rng(0)
    drawn = set()
    for _ in range(300):
        token, logprob = sample_logits(logits, sampling, rng)
        assert logprob == pytest.approx(float(reference[token]), abs=1e-5)
        drawn.add(token)
    assert drawn <= support
    if len(support) <= 10:
        assert drawn == support


def _support(probs: np.ndarray[Any, Any], sampling: SamplingParams) -> set[int]:
    """The tokens a sampler may draw: the top_k most likely, then the fewest whose mass reaches top_p."""
    if sampling.temperature == 0.0:
        return {int(np.argmax(probs))}
    order = [int(i) for i in np.argsort(-probs)]
    if sampling.top_k > 0:
        order = order[: sampling.top_k]
    kept, mass, total = [], 0.0, float(probs[order].sum())
    for token in order:
        if mass >= sampling.top_p:
            break
        kept.append(token)
        mass += float(probs[token]) / total
    return set(kept)


async def test_top_k_1_is_greedy(backend: Any) -> None:
    greedy = await _run(backend, _request(temperature=0.0, max_tokens=8))
    top1 = await _run(backend, _request(temperature=1.0, top_k=1, max_tokens=8, seed=5))
    assert top1[0] == greedy[0]
    assert top1[1] == pytest.approx(greedy[1], abs=1e-5)


async def test_a_stop_id_is_returned_and_ends_the_call(backend: Any) -> None:
    ids, _, _ = await _run(backend, _request(temperature=0.0, max_tokens=8))
    stop = ids[3]
    assert stop not in ids[:3]
    got, logprobs, finish = await _run(backend, _request(temperature=0.0, max_tokens=8, stop=(stop, 99999)))
    assert (got, finish) == (ids[:4], "stop")
    assert len(logprobs) == 4


async def test_streams_chunks_with_the_same_result(backend: Any) -> None:
    whole = await _run(backend, _request(max_tokens=10, seed=7))
    chunks = [c async for c in backend.generate(_request(max_tokens=10, seed=7, stream=True))]
    assert len(chunks) >= 3
    assert all(len(c.token_ids) <= 4 for c in chunks)
    assert [c.finish_reason for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
    assert [t for c in chunks for t in c.token_ids] == whole[0]


@pytest.mark.timeout(300)
async def test_concurrent_calls_give_what_each_gives_alone(backend: Any) -> None:
    # Six calls on four slots: two wait for a slot. Different prompts (prefixes of one chat) and lengths.
    prompts = [PROMPT[: len(PROMPT) - k] for k in range(6)]
    alone = [await _run(backend, _request(p, temperature=0.0, max_tokens=8 + k)) for k, p in enumerate(prompts)]
    for count in (4, 6):
        together = await asyncio.gather(
            *(_run(backend, _request(p, temperature=0.0, max_tokens=8 + k)) for k, p in enumerate(prompts[:count]))
        )
        for one, batched in zip(alone, together, strict=False):
            assert batched[0] == one[0]
            assert batched[2] == "length"
            _close(batched[1], one[1])


@pytest.mark.timeout(300)
async def test_a_longer_prompt_reuses_the_previous_calls_cache(backend: Any) -> None:
    ids, _, _ = await _run(backend, _request(temperature=0.0, max_tokens=6))
    follow_up = PROMPT + tuple(ids) + (2, 198, 1, 4093, 198)
    before = backend.prefilled_tokens
    warm = await _run(backend, _request(follow_up, temperature=0.0, max_tokens=8))
    # The slot holds the prompt and the answer but its last token (sampled, never run): that token and the rest.
    assert backend.prefilled_tokens - before == len(follow_up) - (len(PROMPT) + len(ids) - 1)
    cold_backend = _make(slots=1)
    await cold_backend.start()
    try:
        cold = await _run(cold_backend, _request(follow_up, temperature=0.0, max_tokens=8))
        assert cold_backend.prefilled_tokens == len(follow_up)
    finally:
        await cold_backend.close()
    assert warm[0] == cold[0]
    _close(warm[1], cold[1])


async def test_a_cancelled_call_frees_its_slot() -> None:
    b = _make(slots=1)
    await b.start()
    try:
        stream = b.generate(_request(max_tokens=400, seed=1, stream=True))
        first = await anext(stream)
        assert first.token_ids
        assert first.finish_reason is None
        await stream.aclose()
        ids, _, finish = await asyncio.wait_for(_run(b, _request(temperature=0.0, max_tokens=3)), timeout=60)
        assert len(ids) == 3
        assert finish == "length"
        # A waiting call whose task is cancelled never takes the slot either.
        task = asyncio.create_task(_run(b, _request(max_tokens=400, seed=2)))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await asyncio.wait_for(_run(b, _request(temperature=0.0, max_tokens=2)), timeout=60)
    finally:
        await b.close()


async def test_context_limits_and_malformed_requests(backend: Any) -> None:
    with pytest.raises(ContextLengthExceeded):
        await _run(backend, _request((1,) * 512, max_tokens=1))
    ids, _, finish = await _run(backend, _request((1,) * 509, temperature=0.0, max_tokens=50))
    assert len(ids) == 3
    assert finish == "length"
    with pytest.raises(MalformedRequest):
        await _run(backend, _request((), max_tokens=1))
    with pytest.raises(MalformedRequest):
        await _run(backend, _request((49152,), max_tokens=1))
    with pytest.raises(MalformedRequest):
        await _run(backend, _request(max_tokens=0))


async def test_start_and_close_are_idempotent() -> None:
    b = _make(slots=1)
    assert not await b.healthy()
    with pytest.raises(BackendUnavailable):
        await _run(b, _request(max_tokens=1))
    await b.start()
    await b.start()
    assert await b.healthy()
    await b.close()
    await b.close()
    assert not await b.healthy()
    with pytest.raises(BackendUnavailable):
        await _run(b, _request(max_tokens=1))


def test_options_are_validated_and_build_the_backend() -> None:
    from model_proxy.backends.llama_cpp import LlamaCppBackend

    with pytest.raises(InvalidArgument, match="has no option"):
        parse_options("llama_cpp", {"slot": 2})
    with pytest.raises(InvalidArgument, match="slots"):
        parse_options("llama_cpp", {"slots": 0})
    backend = create_backend("llama_cpp", {"slots": 2, "max_context": 1024, "threads": 1}, None)
    assert isinstance(backend, LlamaCppBackend)
    assert backend.name == "llama_cpp"
    assert backend.context_length == 1024
    assert backend.gguf == _gguf()
    assert math.isfinite(backend.prefilled_tokens)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_load_weights_serves_a_checkpoint_re_exported_to_gguf(checkpoint: Path, hf_model: Any) -> None:
    # Exported as float16 matrices: measured 0.0034-0.010 nats from float32 per token, 0.0007-0.0026 on average.
    b = _make(slots=2)
    await b.start()
    try:
        assert await b.check_weights(str(checkpoint)) in ("LlamaForCausalLM", "llama")
        before = b.gguf
        await b.load_weights(str(checkpoint))
        assert b.gguf != before
        assert b.prefilled_tokens == 0
        for prompt in (FRANCE, PROMPT):
            ids, logprobs, _ = await _run(b, _request(prompt, temperature=0.0, max_tokens=16))
            assert _hf_greedy_agrees(hf_model, prompt, ids) == 16
            assert logprobs == pytest.approx(_teacher_forced(hf_model, prompt, ids), abs=0.05)
        exported = b.gguf
        await b.load_weights(str(checkpoint))  # again: the previous export is deleted
        assert not exported.exists()
    finally:
        await b.close()
    assert not b.gguf.exists()


@pytest.mark.timeout(300)
async def test_a_foreign_or_failing_checkpoint_is_refused_and_the_old_model_kept(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    foreign = tmp_path / "foreign"
    shutil.copytree(checkpoint, foreign)
    config = json.loads((foreign / "config.json").read_text())
    (foreign / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 2}))
    b = _make(slots=1)
    await b.start()
    try:
        served = b.gguf
        reference = await _run(b, _request(temperature=0.0, max_tokens=4))
        with pytest.raises(FailedPrecondition, match="num_hidden_layers"):
            await b.check_weights(str(foreign))
        with pytest.raises(FailedPrecondition, match="not a directory"):
            await b.load_weights(str(tmp_path / "nowhere"))

        def broken(*args: Any) -> None:
            raise OSError("disk full")

        monkeypatch.setattr("model_proxy.backends.llama_cpp.export_checkpoint", broken)
        with pytest.raises(FailedPrecondition, match="disk full"):
            await b.load_weights(str(checkpoint))
        assert b.gguf == served
        assert await _run(b, _request(temperature=0.0, max_tokens=4)) == reference
    finally:
        await b.close()


class _Look:
    """A SpareCores stand-in that answers ``idle`` as told and counts the looks."""

    def __init__(self, idle: bool) -> None:
        # One more CPU than the default threads (cores - 1, at least 1), whatever this machine has.
        self.answer, self.count, self.looks = idle, max(2, len(os.sched_getaffinity(0))), 0

    def idle(self) -> bool:
        self.looks += 1
        return self.answer

    def idle_lately(self, max_age_s: float) -> bool:
        return self.answer


LONG = (*PROMPT, *([11] * 200), *PROMPT[-3:])  # a prompt of ~235 tokens: a prefill step worth a look


async def test_idle_cores_are_taken_and_the_same_tokens_sampled() -> None:
    """With the default threads, steps run on every core while they are idle (a fresh look before a long prefill
    step); what is sampled does not change (greedy IDs the same as on one thread, log-probs within rounding)."""
    one = _make(threads=1, spare=_Look(True))
    spare_look = _Look(True)
    spare = _make(threads=None, spare=spare_look)
    for b in (one, spare):
        await b.start()
    try:
        ids1, lp1, _ = await _run(one, _request(LONG, top_k=1, max_tokens=8))
        ids2, lp2, _ = await _run(spare, _request(LONG, top_k=1, max_tokens=8))
        assert one.spare_core_steps == 0  # threads set: never looks
        assert spare_look.looks >= 1  # a fresh look before the prefill step
        assert spare.spare_core_steps >= spare_look.looks + 7  # and every decode step on all cores too
        assert ids1 == ids2
        assert np.abs(np.array(lp1) - np.array(lp2)).max() < 1e-3
        # A call whose prompt is cached but its last token takes no fresh look (a recent one will do).
        looks, steps = spare_look.looks, spare.spare_core_steps
        await _run(spare, _request(LONG, top_k=1, max_tokens=4))
        assert spare_look.looks == looks
        assert spare.spare_core_steps == steps + 4
    finally:
        for b in (one, spare):
            await b.close()


async def test_busy_cores_keep_the_default_threads() -> None:
    busy = _Look(False)
    b = _make(threads=None, spare=busy)
    await b.start()
    try:
        await _run(b, _request(LONG, top_k=1, max_tokens=4))
        assert busy.looks >= 1
        assert b.spare_core_steps == 0
    finally:
        await b.close()
