from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polar_core.model_fixtures import (
    CHATML_TOOLS_TEMPLATE,
    CONTROL_TOKENS,
    END_OF_TEXT,
    IM_END,
    SPECIAL_TOKENS,
    build_tiny_tokenizer,
)
from polar_core.model_fixtures.tokenizer import _trained_vocab_and_merges

FIXED_TEXTS = [
    "",
    "Hello, world!",
    "  leading and trailing spaces  ",
    "\n\n\nnewlines\r\nand\rcarriage returns\t\ttabs",
    "Unicode: café, naïve, Straße, 東京, こんにちは, 안녕하세요, Привет, مرحبا, שלום",
    "Emoji: 🙂🚀🔥👍🏽 👨‍👩‍👧‍👦 🇫🇷",
    "def f(x: int) -> int:\n    return x ** 2  # square\n",
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2, 3]}}',
    "Zero-width: a\u200bb\u200dc, NBSP:\u00a0, BOM:\ufeff, private use: \ue000",
    "control: \x00\x01\x7f and a lone combining mark \u0301",
    "<|im_start|>user\nhi<|im_end|>\n<tool_call>\n{}\n</tool_call><think>x</think><|endoftext|>",
    "<|im_start partial <tool_call without close </think",
    "\U0001f600" * 50 + "a" * 300,
]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def test_vocabulary_size_and_roles(tokenizer) -> None:
    assert 1000 <= len(tokenizer) <= 2000
    assert tokenizer.eos_token == IM_END
    assert tokenizer.pad_token == END_OF_TEXT
    assert tokenizer.bos_token is None
    assert tokenizer.chat_template == CHATML_TOOLS_TEMPLATE
    # Control tokens come last, in a fixed order, after the BPE vocabulary (as in Qwen2.5).
    ids = [tokenizer.convert_tokens_to_ids(t) for t in (*SPECIAL_TOKENS, *CONTROL_TOKENS)]
    assert ids == list(range(len(tokenizer) - len(ids), len(tokenizer)))


@pytest.mark.parametrize("token", [*SPECIAL_TOKENS, *CONTROL_TOKENS])
def test_control_tokens_encode_to_single_ids(tokenizer, token: str) -> None:
    ids = tokenizer.encode(token, add_special_tokens=False)
    assert len(ids) == 1
    assert tokenizer.convert_ids_to_tokens(ids) == [token]
    # The same id inside running text, without merging into neighbours.
    in_text = tokenizer.encode(f"x{token}y", add_special_tokens=False)
    assert ids[0] in in_text


def test_special_and_non_special_added_tokens(tokenizer) -> None:
    text = "<|im_start|>assistant\n<think>a</think><tool_call>b</tool_call><|im_end|>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    # Like Qwen2.5, <tool_call> and <think> are not special, so skip_special_tokens keeps them.
    assert tokenizer.decode(ids, skip_special_tokens=True) == "assistant\n<think>a</think><tool_call>b</tool_call>"


@pytest.mark.parametrize("text", FIXED_TEXTS)
def test_round_trip_fixed_texts(tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


@settings(max_examples=300, deadline=None)
@given(text=st.text())
def test_round_trip_arbitrary_nfc_text(tokenizer, text: str) -> None:
    # Qwen2's pipeline NFC-normalizes, so NFC text round-trips exactly and other text comes back in NFC.
    text = unicodedata.normalize("NFC", text)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


@settings(max_examples=100, deadline=None)
@given(text=st.text(alphabet=st.characters(codec="utf-8")))
def test_arbitrary_text_decodes_to_its_nfc_form(tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    decoded = tokenizer.decode(ids, skip_special_tokens=False)
    assert unicodedata.normalize("NFC", decoded) == unicodedata.normalize("NFC", text)


def test_non_nfc_text_is_normalized_like_qwen(tokenizer) -> None:
    decomposed = "cafe\u0301"
    ids = tokenizer.encode(decomposed, add_special_tokens=False)
    assert tokenizer.decode(ids) == "café"


def test_builds_are_identical(tokenizer) -> None:
    _trained_vocab_and_merges.cache_clear()
    rebuilt = build_tiny_tokenizer()
    assert rebuilt is not tokenizer
    assert rebuilt.get_vocab() == tokenizer.get_vocab()
    assert rebuilt.backend_tokenizer.to_str() == tokenizer.backend_tokenizer.to_str()
    for text in FIXED_TEXTS:
        assert rebuilt.encode(text) == tokenizer.encode(text)


@pytest.mark.timeout(360)  # a fresh interpreter imports transformers: minutes on two loaded cores
def test_build_is_identical_in_another_process(tokenizer) -> None:
    # Rust HashMaps are seeded per process; training must not depend on their iteration order.
    script = (
        "import hashlib; from polar_core.model_fixtures import build_tiny_tokenizer; "
        "print(hashlib.sha256(build_tiny_tokenizer().backend_tokenizer.to_str().encode()).hexdigest())"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300)
    expected = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()
    assert result.stdout.strip() == expected


def test_pipeline_is_qwen2s(tokenizer) -> None:
    pipeline = json.loads(tokenizer.backend_tokenizer.to_str())
    assert type(tokenizer).__name__ == "Qwen2Tokenizer"
    assert pipeline["normalizer"] == {"type": "NFC"}
    assert pipeline["decoder"]["type"] == "ByteLevel"
    assert pipeline["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] is False
