from __future__ import annotations

import pytest
import torch

from polar_core.model_fixtures import (
    build_tiny_model,
    build_tiny_tokenizer,
    generate_with_logprobs,
    teacher_forced_logprobs,
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_tiny_model(tokenizer, seed=0)


@pytest.fixture(scope="module")
def prompt_ids(tokenizer) -> list[int]:
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a haiku about tokens."}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    assert isinstance(ids, list)
    return ids


def test_config_shape(tokenizer, model) -> None:
    config = model.config
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert config.vocab_size == len(tokenizer)
    assert config.num_hidden_layers == 2
    assert config.num_attention_heads == 4
    assert config.num_key_value_heads == 2
    assert config.head_dim == 32
    assert config.hidden_size == config.num_attention_heads * config.head_dim
    assert config.max_position_embeddings == 4096
    assert config.tie_word_embeddings
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.dtype == torch.float32
    assert not model.training
    assert config.eos_token_id == tokenizer.eos_token_id
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id


def test_weights_depend_only_on_seed(tokenizer, model) -> None:
    rng_before = torch.get_rng_state()
    same = build_tiny_model(tokenizer, seed=0)
    other = build_tiny_model(tokenizer, seed=1)
    assert torch.equal(torch.get_rng_state(), rng_before), "building must not disturb the global RNG"
    for (name, a), b, c in zip(
        model.state_dict().items(), same.state_dict().values(), other.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
        if name.endswith("proj.weight"):
            assert not torch.equal(a, c), name


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.5])
def test_sampled_logprobs_match_teacher_forcing(tokenizer, model, prompt_ids, temperature: float) -> None:
    tokens, logprobs = generate_with_logprobs(
        model, prompt_ids, max_new_tokens=40, temperature=temperature, seed=3, eos_token_id=None
    )
    assert len(tokens) == len(logprobs) == 40
    assert all(lp <= 0.0 for lp in logprobs)
    forced = teacher_forced_logprobs(model, prompt_ids, tokens, temperature=temperature)
    assert forced == pytest.approx(logprobs, abs=1e-4)


def test_sampling_is_deterministic_per_seed(model, prompt_ids) -> None:
    torch.manual_seed(123)  # the global RNG must not matter
    first = generate_with_logprobs(model, prompt_ids, max_new_tokens=30, seed=7, eos_token_id=None)
    torch.manual_seed(456)
    second = generate_with_logprobs(model, prompt_ids, max_new_tokens=30, seed=7, eos_token_id=None)
    other = generate_with_logprobs(model, prompt_ids, max_new_tokens=30, seed=8, eos_token_id=None)
    assert first == second
    assert first[0] != other[0]


def test_greedy_matches_transformers_generate(model, prompt_ids) -> None:
    tokens, logprobs = generate_with_logprobs(
        model, prompt_ids, max_new_tokens=12, temperature=0.0, seed=0, eos_token_id=None
    )
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt_ids]),
            max_new_tokens=12,
            min_new_tokens=12,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    assert out.sequences[0, len(prompt_ids) :].tolist() == tokens
    # Raw logits from generate give the same log-probabilities.
    expected = [
        torch.log_softmax(step[0].float(), dim=-1)[token].item() for step, token in zip(out.logits, tokens, strict=True)
    ]
    assert logprobs == pytest.approx(expected, abs=1e-4)
    assert teacher_forced_logprobs(model, prompt_ids, tokens, temperature=0.0) == pytest.approx(logprobs, abs=1e-4)


def test_generation_stops_after_eos(model, prompt_ids) -> None:
    tokens, _ = generate_with_logprobs(model, prompt_ids, max_new_tokens=10, seed=5, eos_token_id=None)
    stop_token = tokens[3]
    first_stop = tokens.index(stop_token)
    stopped, logprobs = generate_with_logprobs(
        model, prompt_ids, max_new_tokens=10, seed=5, eos_token_id=[stop_token, -1]
    )
    assert stopped == tokens[: first_stop + 1]
    assert len(logprobs) == len(stopped)


def test_edge_cases(model, prompt_ids) -> None:
    assert generate_with_logprobs(model, prompt_ids, max_new_tokens=0, seed=0, eos_token_id=None) == ([], [])
    assert teacher_forced_logprobs(model, prompt_ids, []) == []
    with pytest.raises(ValueError, match="prompt_ids"):
        generate_with_logprobs(model, [], max_new_tokens=1, seed=0, eos_token_id=None)
    with pytest.raises(ValueError, match="temperature"):
        teacher_forced_logprobs(model, prompt_ids, [1], temperature=-1.0)
