"""A tiny random Qwen2 causal LM, and reference sampling/scoring with raw log-probabilities.

The model is small enough to build in well under a second on CPU, yet has the real Qwen2 architecture
(grouped-query attention, RoPE, tied embeddings), so vLLM and Triton backends can serve a saved copy.

:func:`generate_with_logprobs` and :func:`teacher_forced_logprobs` work with any causal LM that follows the
transformers calling convention (the tiny model, SmolLM2). They are the reference that backends' returned
log-probabilities are checked against: log-probabilities are ``log_softmax(logits / temperature)`` with no
other logits processing (no top-k/top-p, no repetition penalty).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

TINY_MODEL_LAYERS = 2
TINY_MODEL_HIDDEN = 128
TINY_MODEL_HEADS = 4
TINY_MODEL_KV_HEADS = 2
# hidden / heads, stated explicitly: vLLM's CPU attention needs a head dimension of at least 32, and
# keeping head_dim == hidden / heads means every Qwen2 implementation derives the same shapes.
TINY_MODEL_HEAD_DIM = 32
TINY_MODEL_INTERMEDIATE = 256
TINY_MODEL_MAX_POSITIONS = 4096
# Larger than Qwen's 0.02 so the random model's next-token distributions are far from uniform, which
# makes log-probability comparisons in tests meaningful.
TINY_MODEL_INIT_RANGE = 0.1


def tiny_model_config(tokenizer: PreTrainedTokenizerBase, *, tie_word_embeddings: bool = True) -> Qwen2Config:
    """Return the tiny Qwen2 configuration sized for ``tokenizer``.

    Args:
        tokenizer: The tokenizer the model will be paired with; its full length (added tokens included)
            becomes the vocabulary size, and its EOS/PAD ids the config's.
        tie_word_embeddings: Whether the output layer shares the input embedding (the default). vLLM's CPU
            build cannot reload a tied output layer in place, so weight-update tests use untied models.

    Returns:
        A float32 ``Qwen2Config`` with 2 layers, hidden size 128, 4 query heads and 2 key/value heads of
        dimension 32, and (unless told otherwise) tied input/output embeddings.
    """
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=TINY_MODEL_HIDDEN,
        intermediate_size=TINY_MODEL_INTERMEDIATE,
        num_hidden_layers=TINY_MODEL_LAYERS,
        num_attention_heads=TINY_MODEL_HEADS,
        num_key_value_heads=TINY_MODEL_KV_HEADS,
        max_position_embeddings=TINY_MODEL_MAX_POSITIONS,
        initializer_range=TINY_MODEL_INIT_RANGE,
        tie_word_embeddings=tie_word_embeddings,
        use_sliding_window=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    # Not a declared Qwen2Config field, but read by transformers' and vLLM's Qwen2 attention when present.
    config.head_dim = TINY_MODEL_HEAD_DIM
    return config


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase, *, seed: int = 0, tie_word_embeddings: bool = True
) -> Qwen2ForCausalLM:
    """Build the tiny Qwen2 model with weights drawn deterministically from ``seed``.

    The global torch RNG state is saved and restored, so building a model does not perturb other code.

    Args:
        tokenizer: The tokenizer whose vocabulary the model covers (see :func:`tiny_model_config`).
        seed: Seed for the weight initialization; equal seeds give bit-identical weights.
        tie_word_embeddings: Whether the output layer shares the input embedding (see :func:`tiny_model_config`).

    Returns:
        The model in float32, on CPU, in eval mode.
    """
    config = tiny_model_config(tokenizer, tie_word_embeddings=tie_word_embeddings)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.bos_token_id = None
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.train(False)  # eval mode
    return model


def _eos_set(eos_token_id: int | Sequence[int] | None) -> frozenset[int]:
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, int):
        return frozenset({eos_token_id})
    return frozenset(eos_token_id)


def _log_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    # Temperature 0 means greedy decoding; its log-probabilities are those of the raw logits, as vLLM
    # reports them.
    scaled = logits.float() if temperature == 0.0 else logits.float() / temperature
    return torch.log_softmax(scaled, dim=-1)


def _forward(model: PreTrainedModel, input_ids: torch.Tensor, cache: DynamicCache | None) -> torch.Tensor:
    """Run ``model`` on ``input_ids``, appending to ``cache`` in place when one is given."""
    # transformers 5.x renamed ``past_key_values`` to ``cache`` (the old name warns); support both so a
    # different pinned 5.x neither warns nor silently drops the cache into ``**kwargs``.
    params = inspect.signature(model.forward).parameters
    cache_arg = "cache" if "cache" in params else "past_key_values"
    kwargs: dict[str, Any] = {cache_arg: cache, "use_cache": cache is not None}
    out = model(input_ids=input_ids, **kwargs)
    logits: torch.Tensor = out.logits
    return logits


def generate_with_logprobs(
    model: PreTrainedModel,
    prompt_ids: Sequence[int],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    seed: int,
    eos_token_id: int | Sequence[int] | None,
) -> tuple[list[int], list[float]]:
    """Sample a continuation and the raw log-probability of each sampled token.

    Decoding uses the model's KV cache and a private ``torch.Generator``, so results depend only on the
    arguments (not on global RNG state). Sampling stops after ``max_new_tokens`` tokens or right after an
    EOS token, which is included in the output, as vLLM includes it in ``token_ids``.

    Args:
        model: A causal LM in eval mode.
        prompt_ids: The prompt token ids (at least one).
        max_new_tokens: The most tokens to sample.
        temperature: Softmax temperature; 0 selects greedy decoding.
        seed: Seed of the sampling generator.
        eos_token_id: Token id(s) that end generation, or ``None`` to always sample ``max_new_tokens``.

    Returns:
        The sampled token ids and, for each, ``log_softmax(logits / temperature)`` at that token
        (``log_softmax(logits)`` when ``temperature`` is 0).

    Raises:
        ValueError: If ``prompt_ids`` is empty, or ``max_new_tokens`` or ``temperature`` is negative.
    """
    if not prompt_ids:
        raise ValueError("prompt_ids must not be empty")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if temperature < 0.0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    stop = _eos_set(eos_token_id)
    device = next(model.parameters()).device
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    tokens: list[int] = []
    logprobs: list[float] = []
    with torch.inference_mode():
        inputs = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
        cache = DynamicCache(config=model.config)
        for _ in range(max_new_tokens):
            logits = _forward(model, inputs, cache)
            log_probs = _log_probs(logits[0, -1], temperature)
            if temperature == 0.0:
                token = int(torch.argmax(log_probs).item())
            else:
                token = int(torch.multinomial(log_probs.exp(), 1, generator=generator).item())
            tokens.append(token)
            logprobs.append(float(log_probs[token].item()))
            if token in stop:
                break
            inputs = torch.tensor([[token]], dtype=torch.long, device=device)
    return tokens, logprobs


def teacher_forced_logprobs(
    model: PreTrainedModel,
    prompt_ids: Sequence[int],
    response_ids: Sequence[int],
    temperature: float = 1.0,
) -> list[float]:
    """Score ``response_ids`` after ``prompt_ids`` in one forward pass.

    Args:
        model: A causal LM in eval mode.
        prompt_ids: The prompt token ids (at least one).
        response_ids: The tokens to score.
        temperature: Softmax temperature, as in :func:`generate_with_logprobs` (0 means raw logits).

    Returns:
        For each response token, ``log_softmax(logits / temperature)`` at that token given all tokens
        before it.

    Raises:
        ValueError: If ``prompt_ids`` is empty or ``temperature`` is negative.
    """
    if not prompt_ids:
        raise ValueError("prompt_ids must not be empty")
    if temperature < 0.0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not response_ids:
        return []
    device = next(model.parameters()).device
    ids = [*prompt_ids, *response_ids]
    with torch.inference_mode():
        logits = _forward(model, torch.tensor([ids], dtype=torch.long, device=device), None)
        # Position i predicts token i + 1, so the response is scored by positions len(prompt) - 1 ... -2.
        start = len(prompt_ids) - 1
        log_probs = _log_probs(logits[0, start : start + len(response_ids)], temperature)
        targets = torch.tensor(list(response_ids), dtype=torch.long, device=device)
        picked = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return [float(x) for x in picked.tolist()]
