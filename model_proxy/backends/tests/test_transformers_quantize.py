"""The transformers backend's ``quantize`` option: parsed, refused when wrong, log-probs of the served model."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear
from transformers import AutoModelForCausalLM, DynamicCache

from model_proxy.backends.factory import create_backend, parse_options
from model_proxy.backends.options import TransformersOptions
from model_proxy.backends.transformers_backend import TransformersBackend
from model_proxy.backends.transformers_quantize import quantize_model
from model_proxy.models import GenerationRequest, SamplingParams
from polar_core.errors import InvalidArgument
from polar_core.model_fixtures import build_tiny_model, build_tiny_tokenizer, teacher_forced_logprobs

PROMPT = (5, 17, 200, 31, 9, 77, 4, 120, 33)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tiny_tokenizer()


async def _sample(backend: TransformersBackend, prompt: Sequence[int] = PROMPT) -> tuple[list[int], list[float]]:
    request = GenerationRequest(
        prompt_token_ids=tuple(prompt),
        sampling=SamplingParams(temperature=1.0, max_tokens=12, seed=7),
        stop_token_ids=(),
        request_id="r",
    )
    chunks = [c async for c in backend.generate(request)]
    return [t for c in chunks for t in c.token_ids], [p for c in chunks for p in c.logprobs]


def _replay(model: Any, prompt: Sequence[int], ids: Sequence[int], block: int) -> list[float]:
    """The log-probabilities ``model`` gives ``ids`` when run as the backend runs it: the prompt in blocks of
    ``block`` positions, then one token per forward pass (int8 activations are quantised per pass), the LM head
    over the last position only (a float16 GEMM rounds differently with one row than with several)."""
    cache = DynamicCache(config=model.config)
    out: Any = None
    scores: list[float] = []
    with torch.inference_mode():
        for start in range(0, len(prompt), block):
            inputs = torch.tensor([list(prompt[start : start + block])])
            out = model(input_ids=inputs, cache=cache, use_cache=True, logits_to_keep=1)
        for token in ids:
            scores.append(float(torch.log_softmax(out.logits[0, -1].float(), dim=-1)[token].item()))
            out = model(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True, logits_to_keep=1)
    return scores


async def _replay_in(backend: TransformersBackend, model: Any, ids: Sequence[int]) -> list[float]:
    """:func:`_replay` on the backend's decoding thread, with its thread count: fbgemm's float16 GEMM splits
    its work, and so rounds, by the number of threads."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(backend._executor, _replay, model, PROMPT, ids, backend._prefix.block)


def _quantized_layers(model: Any) -> int:
    return sum(isinstance(m, DynamicQuantizedLinear) for m in model.modules())


def test_option_parses_and_defaults_to_none() -> None:
    assert parse_options("transformers", {}) == TransformersOptions(quantize="none")
    for kind in ("none", "int8", "float16"):
        options = parse_options("transformers", {"quantize": kind})
        assert isinstance(options, TransformersOptions)
        assert options.quantize == kind


@pytest.mark.parametrize("value", ["int4", "INT8", "bf16", 8, True])
def test_bad_kinds_are_refused_naming_the_choices(value: object) -> None:
    with pytest.raises(InvalidArgument, match=r"quantize: Input should be 'none', 'int8' or 'float16'"):
        parse_options("transformers", {"quantize": value})


def test_the_backend_refuses_a_bad_kind_too(tokenizer: Any) -> None:
    with pytest.raises(InvalidArgument, match=r"quantize must be one of \['none', 'int8', 'float16'\], not 'int4'"):
        TransformersBackend(build_tiny_model(tokenizer, seed=0), quantize="int4")  # type: ignore[arg-type]


async def test_a_model_not_float32_on_cpu_is_refused(tokenizer: Any) -> None:
    model: Any = build_tiny_model(tokenizer, seed=0)
    backend = TransformersBackend(model.to(torch.bfloat16), quantize="int8")
    with pytest.raises(InvalidArgument, match=r"needs a float32 model on CPU, not torch.bfloat16"):
        await backend.start()
    assert not await backend.healthy()


@pytest.mark.parametrize("kind", ["int8", "float16"])
async def test_recorded_logprobs_are_the_quantized_models(tokenizer: Any, kind: str) -> None:
    model = build_tiny_model(tokenizer, seed=0)
    backend = create_backend("transformers", {"quantize": kind, "prefill_block": 4}, tokenizer, weights=model)
    assert isinstance(backend, TransformersBackend)
    await backend.start()
    try:
        served = backend._model
        assert served is not model
        assert _quantized_layers(served) > 0
        assert _quantized_layers(model) == 0  # the caller's weights stay float32
        ids, recorded = await _sample(backend)
        # The same quantised model, run pass for pass as the backend ran it, gives exactly what was recorded.
        assert recorded == await _replay_in(backend, served, ids)
        # An independently quantised copy of the same weights too: the recorded values are the served policy's.
        assert recorded == await _replay_in(backend, quantize_model(model, kind, inplace=False), ids)  # type: ignore[arg-type]
        # ...and not float32's: nothing was recomputed with the unquantised model.
        float32 = teacher_forced_logprobs(model, PROMPT, ids)
        assert recorded != pytest.approx(float32, abs=1e-7)
    finally:
        await backend.close()


async def test_a_weight_update_is_quantized_again(tokenizer: Any, tmp_path: Path) -> None:
    for name, seed in (("a", 0), ("b", 1)):
        build_tiny_model(tokenizer, seed=seed).save_pretrained(tmp_path / name)
    backend = TransformersBackend(str(tmp_path / "a"), quantize="int8", prefill_block=4)
    await backend.start()
    try:
        layers = _quantized_layers(backend._model)
        assert layers > 0
        assert await backend.check_weights(str(tmp_path / "b")) == "Qwen2ForCausalLM"
        await backend.load_weights(str(tmp_path / "b"))
        assert _quantized_layers(backend._model) == layers
        ids, recorded = await _sample(backend)
        fresh = AutoModelForCausalLM.from_pretrained(str(tmp_path / "b"), dtype=torch.float32).eval()  # type: ignore[no-untyped-call]
        assert recorded == await _replay_in(backend, quantize_model(fresh, "int8", inplace=True), ids)
        # Served after the update: B, quantised; not A's weights, and not B in float32.
        old = AutoModelForCausalLM.from_pretrained(str(tmp_path / "a"), dtype=torch.float32).eval()  # type: ignore[no-untyped-call]
        assert recorded != await _replay_in(backend, quantize_model(old, "int8", inplace=True), ids)
        assert recorded != pytest.approx(teacher_forced_logprobs(fresh, PROMPT, ids), abs=1e-7)
    finally:
        await backend.close()
