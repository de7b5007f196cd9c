"""Loading a new checkpoint into the in-process transformers backend and the scripted backend."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from model_proxy.backends.scripted import ScriptedBackend, ScriptTurn
from model_proxy.backends.tests.unfit_checkpoints import UNFIT_CASES, write_unfit_checkpoints
from model_proxy.backends.transformers_backend import TransformersBackend
from model_proxy.models import GenerationRequest, SamplingParams
from polar_core.errors import FailedPrecondition
from polar_core.model_fixtures import build_tiny_model, build_tiny_tokenizer, teacher_forced_logprobs, tiny_model_config

PROMPT = (5, 17, 200, 31, 9, 77)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def checkpoints(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpt")
    out: dict[str, Path] = {}
    for name, seed in (("a", 0), ("b", 1)):
        out[name] = root / name
        build_tiny_model(tokenizer, seed=seed).save_pretrained(out[name])
    raw = tiny_model_config(tokenizer).to_dict()
    raw.update(num_hidden_layers=1, layer_types=raw["layer_types"][:1])
    config = Qwen2Config.from_dict(raw)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        Qwen2ForCausalLM(config).save_pretrained(root / "shallow")
    out["shallow"] = root / "shallow"
    (root / "no-config").mkdir()
    out["no-config"] = root / "no-config"
    (root / "config-only").mkdir()
    (root / "config-only" / "config.json").write_text((out["a"] / "config.json").read_text())
    out["config-only"] = root / "config-only"
    out.update(write_unfit_checkpoints(out["b"], root / "unfit"))
    return out


@pytest.fixture
async def backend(tokenizer: Any) -> AsyncIterator[TransformersBackend]:
    b = TransformersBackend(build_tiny_model(tokenizer, seed=0))
    await b.start()
    yield b
    await b.close()


async def _sample(backend: TransformersBackend) -> tuple[list[int], list[float]]:
    request = GenerationRequest(
        prompt_token_ids=PROMPT, sampling=SamplingParams(max_tokens=6, seed=3), stop_token_ids=(), request_id="r"
    )
    chunks = [c async for c in backend.generate(request)]
    return [t for c in chunks for t in c.token_ids], [p for c in chunks for p in c.logprobs]


async def test_check_names_the_architecture(backend: TransformersBackend, checkpoints: dict[str, Path]) -> None:
    assert await backend.check_weights(str(checkpoints["b"])) == "Qwen2ForCausalLM"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("missing", "is not a directory"),
        ("no-config", "no config.json"),
        ("config-only", "no weight files"),
        ("shallow", r"num_hidden_layers 1 \(served: 2\)"),
    ],
)
async def test_check_rejects_unfit_checkpoints(
    backend: TransformersBackend, checkpoints: dict[str, Path], tmp_path: Path, name: str, message: str
) -> None:
    path = checkpoints.get(name, tmp_path / "missing")
    with pytest.raises(FailedPrecondition, match=message):
        await backend.check_weights(str(path))
    with pytest.raises(FailedPrecondition, match=message):
        await backend.load_weights(str(path))


async def test_load_swaps_the_weights_and_sampling_follows(
    backend: TransformersBackend, checkpoints: dict[str, Path], tokenizer: Any
) -> None:
    before_ids, before_lps = await _sample(backend)
    await backend.load_weights(str(checkpoints["b"]))
    ids, lps = await _sample(backend)
    model_b = build_tiny_model(tokenizer, seed=1)
    assert lps == pytest.approx(teacher_forced_logprobs(model_b, PROMPT, ids), abs=1e-4)
    model_a = build_tiny_model(tokenizer, seed=0)
    assert lps != pytest.approx(teacher_forced_logprobs(model_a, PROMPT, ids), abs=1e-4)
    assert (ids, lps) != (before_ids, before_lps)
    # A rejected checkpoint afterwards leaves B in place.
    with pytest.raises(FailedPrecondition):
        await backend.load_weights(str(checkpoints["shallow"]))
    assert await _sample(backend) == (ids, lps)


async def test_scripted_accepts_any_directory(tokenizer: Any, tmp_path: Path) -> None:
    backend = ScriptedBackend([ScriptTurn(text="hi")], tokenizer, end_of_turn_id=0)
    assert await backend.check_weights(str(tmp_path)) == ""
    await backend.load_weights(str(tmp_path))
    with pytest.raises(FailedPrecondition, match="is not a directory"):
        await backend.check_weights(str(tmp_path / "nope"))


@pytest.mark.parametrize("name", sorted(UNFIT_CASES))
async def test_tensors_are_checked_by_name_shape_and_dtype_before_anything_loads(
    backend: TransformersBackend, checkpoints: dict[str, Path], name: str
) -> None:
    before = await _sample(backend)
    for call in (backend.check_weights, backend.load_weights):
        with pytest.raises(FailedPrecondition) as refused:
            await call(str(checkpoints[name]))
        for pattern in UNFIT_CASES[name]:
            assert re.search(pattern, refused.value.message), (pattern, refused.value.message)
    assert await _sample(backend) == before  # still the served weights


async def test_a_tied_model_accepts_a_checkpoint_with_or_without_its_output_layer(
    backend: TransformersBackend, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file

    with_head = tmp_path / "with-head"
    with_head.mkdir()
    (with_head / "config.json").write_text((checkpoints["b"] / "config.json").read_text())
    tensors = load_file(str(checkpoints["b"] / "model.safetensors"))
    assert "lm_head.weight" not in tensors
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, str(with_head / "model.safetensors"), metadata={"format": "pt"})
    assert await backend.check_weights(str(with_head)) == "Qwen2ForCausalLM"
    assert await backend.check_weights(str(checkpoints["b"])) == "Qwen2ForCausalLM"
