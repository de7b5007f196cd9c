from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from polar_core.model_fixtures import (
    MARKER_FILE,
    build_tiny_model,
    build_tiny_tokenizer,
    ensure_tiny_model_dir,
    save_tiny_model,
    tiny_model_build_key,
)

SAMPLE_TEXTS = [
    "Hello\n\nworld  123456 it's  \r\n 🙂",
    "<|im_start|>user\n<tool_call>{}</tool_call><think>x</think><|im_end|>",
    "def f(x):\n    return {'a': [1, 2.5]}\n",
]


@pytest.fixture(scope="module")
def saved_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def test_saved_directory_round_trips(saved_dir) -> None:
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer)
    loaded_tokenizer = AutoTokenizer.from_pretrained(saved_dir)
    loaded_model = AutoModelForCausalLM.from_pretrained(saved_dir)
    assert type(loaded_model).__name__ == "Qwen2ForCausalLM"
    assert loaded_model.dtype == torch.float32
    # Same pipeline, vocabulary, roles and template as the in-memory tokenizer, so servers agree with it.
    assert loaded_tokenizer.backend_tokenizer.to_str() == tokenizer.backend_tokenizer.to_str()
    assert loaded_tokenizer.chat_template == tokenizer.chat_template
    assert (loaded_tokenizer.eos_token, loaded_tokenizer.pad_token) == (tokenizer.eos_token, tokenizer.pad_token)
    for text in SAMPLE_TEXTS:
        assert loaded_tokenizer.encode(text) == tokenizer.encode(text)
    ids = torch.tensor([tokenizer.encode(" ".join(SAMPLE_TEXTS))])
    with torch.inference_mode():
        assert torch.equal(loaded_model(ids).logits, model(ids).logits)


def test_saved_directory_layout(saved_dir) -> None:
    names = {path.name for path in saved_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", MARKER_FILE} <= names
    assert not list(saved_dir.parent.glob(".model.*")), "staging directory left behind"
    config = json.loads((saved_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2"
    assert config["head_dim"] == 32
    generation = json.loads((saved_dir / "generation_config.json").read_text())
    # vLLM takes default sampling parameters from this file; the fixture must not set any.
    assert not {"temperature", "top_p", "top_k", "do_sample", "repetition_penalty"} & generation.keys()


def test_save_is_idempotent(saved_dir) -> None:
    marker = saved_dir / MARKER_FILE
    before = {path.name: path.stat().st_mtime_ns for path in saved_dir.iterdir()}
    assert save_tiny_model(saved_dir) == saved_dir
    assert {path.name: path.stat().st_mtime_ns for path in saved_dir.iterdir()} == before
    assert json.loads(marker.read_text())["key"] == tiny_model_build_key()


def test_damaged_or_other_builds_are_rebuilt(tmp_path) -> None:
    directory = save_tiny_model(tmp_path / "model")
    weights = directory / "model.safetensors"
    original = weights.read_bytes()
    weights.write_bytes(b"truncated")
    save_tiny_model(directory)
    assert weights.read_bytes() == original
    # A different seed is a different build: the directory is rewritten and its marker updated.
    save_tiny_model(directory, seed=1)
    assert weights.read_bytes() != original
    assert json.loads((directory / MARKER_FILE).read_text())["key"] == tiny_model_build_key(seed=1)


def test_builds_are_byte_identical(tmp_path, saved_dir) -> None:
    other = save_tiny_model(tmp_path / "again")
    for path in saved_dir.iterdir():
        assert (other / path.name).read_bytes() == path.read_bytes(), path.name


def test_ensure_tiny_model_dir_keys_by_build(tmp_path) -> None:
    first = ensure_tiny_model_dir(tmp_path)
    assert first.parent == tmp_path
    assert tiny_model_build_key()[:16] in first.name
    assert ensure_tiny_model_dir(tmp_path) == first
    assert ensure_tiny_model_dir(tmp_path, seed=1) != first
