"""A tiny, deterministic byte-level BPE tokenizer with Qwen2.5-style ChatML tokens.

The tokenizer is trained at call time (about 20 ms) on a few kilobytes of embedded English, code and JSON,
so tests never download anything. It uses Qwen2's exact pipeline (NFC, Qwen2's split regex, byte-level
BPE; see :func:`build_tiny_tokenizer` for why), so every NFC string round-trips exactly, and carries the
same control tokens as Qwen2.5: ChatML special tokens plus ``<tool_call>``/``</tool_call>`` and
``<think>``/``</think>`` as added, non-special tokens, appended after the BPE vocabulary like Qwen's.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Tokenizer
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

from polar_core.model_fixtures.chat_template import CHATML_TOOLS_TEMPLATE

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
SPECIAL_TOKENS: tuple[str, ...] = (END_OF_TEXT, IM_START, IM_END)
# Qwen2.5 registers these as added tokens that are *not* special, so they survive skip_special_tokens.
CONTROL_TOKENS: tuple[str, ...] = ("<tool_call>", "</tool_call>", "<think>", "</think>")

# An upper bound for the trainer: the corpus yields about 1,200 tokens in all.
TINY_VOCAB_SIZE = 1536
TINY_MODEL_MAX_LENGTH = 4096

_CORPUS_PROSE = """\
You are a helpful assistant. Answer the user's question carefully and concisely.
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
Reinforcement learning trains a policy by sampling rollouts, scoring them with a reward, and updating
the model so that better actions become more likely. An agent runs inside its harness, calls tools,
reads their results and keeps going until the task is done or the turn limit is reached.
Please read the file, run the tests, and fix the failing function. I will check the output now.
What is the weather like in Paris today? It is sunny with a light breeze and about 21 degrees.
Let me think step by step. First, list the files in the repository. Then open the one that fails.
The tests passed. The build failed because a module was missing. Try again with the correct path.
Thank you! You're welcome. Is there anything else I can help you with? Yes, one more question.
"""

_CORPUS_CODE = """\
from __future__ import annotations

import json
import os
from pathlib import Path


def read_config(path: Path) -> dict[str, object]:
    \"\"\"Read a JSON configuration file and return its contents.\"\"\"
    with path.open("r", encoding="utf-8") as handle:
        return json.load(handle)


class Counter:
    def __init__(self, start: int = 0) -> None:
        self.value = start

    def increment(self, step: int = 1) -> int:
        self.value += step
        return self.value


for index, item in enumerate(items):
    if item is None:
        continue
    print(f"{index}: {item!r}")

def fibonacci(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a

$ ls -la src/ && cat README.md | head -n 20
$ python -m pytest -q tests/test_main.py
$ git diff --stat && git status
function add(a, b) { return a + b; }
const result = await fetch("/api/v1/items?limit=10");
SELECT id, name FROM users WHERE active = 1 ORDER BY name;
"""

_CORPUS_MARKUP = """\
<|im_start|>system
You are a helpful assistant.

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> \
XML tags:
<|im_end|>
<|im_start|>user
<tool_response>
</tool_response>
<|im_end|>
<|im_start|>assistant
<think>
</think>
<tool_call>
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
</tool_call>
<|im_end|>
"""

_CORPUS_JSON: tuple[object, ...] = (
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file from the workspace and return its text.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "Path of the file to read."}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_command",
            "description": "Run a shell command and return stdout, stderr and the exit code.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string"},
                    "timeout": {"type": "integer", "minimum": 1},
                },
                "required": ["command"],
            },
        },
    },
    {"name": "search", "arguments": {"query": "weather in Paris", "max_results": 5, "safe": True}},
    {"stdout": "3 passed, 1 failed in 0.42s\n", "stderr": "", "exit_code": 1, "files": ["a.py", "b.py"]},
    {"id": "call_0", "role": "tool", "content": "null", "values": [1, 2.5, -3, 1e-06, False, None]},
)

_CORPUS_MISC = """\
0 1 2 3 4 5 6 7 8 9 10 11 12 16 20 32 42 64 100 128 256 512 1000 1024 2024 2048 4096 3.14 0.5 -1
Unicode: café, naïve, Straße, Ærø, 東京, こんにちは, 안녕하세요, Привет, مرحبا, שלום, ✓ ✗ → ← • … — “quotes”
Emoji: 🙂 🚀 🔥 👍 🎉 and tabs\tand\r\nwindows line endings.
"""


def _training_corpus() -> list[str]:
    """Return the embedded training corpus as a list of documents (pure, deterministic)."""
    json_docs = [json.dumps(doc) for doc in _CORPUS_JSON]
    json_docs += [json.dumps(doc, indent=2) for doc in _CORPUS_JSON]
    return [_CORPUS_PROSE, _CORPUS_CODE, _CORPUS_MARKUP, _CORPUS_MISC, *json_docs]


@functools.cache
def _trained_vocab_and_merges() -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, str], ...]]:
    """Train the BPE model once per process; return its vocabulary and merges (immutable, deterministic)."""
    trainer_tokenizer = Tokenizer(models.BPE())
    # The same normalizer and pre-tokenizer as Qwen2Tokenizer, so the merges fit how text is split later.
    trainer_tokenizer.normalizer = normalizers.NFC()
    trainer_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        min_frequency=1,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    trainer_tokenizer.train_from_iterator(_training_corpus(), trainer=trainer)
    model = json.loads(trainer_tokenizer.to_str())["model"]
    vocab = tuple(sorted(model["vocab"].items(), key=lambda item: item[1]))
    merges = tuple((left, right) for left, right in model["merges"])
    return vocab, merges


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Build the tiny ChatML tokenizer.

    The result is a ``Qwen2Tokenizer`` (NFC normalizer, Qwen2's split regex, byte-level BPE), because
    that is what ``AutoTokenizer.from_pretrained`` (and so vLLM) builds from any directory whose
    ``config.json`` says ``model_type: qwen2``: transformers 5 rebuilds Qwen2's pipeline from the vocabulary
    and merges and ignores the pipeline stored in ``tokenizer.json``. Building the same class here keeps
    token ids identical between this object and every server that loads the saved fixture.

    Returns:
        A fresh tokenizer with ``eos_token`` ``<|im_end|>``, ``pad_token`` ``<|endoftext|>``, no BOS or UNK
        token, and :data:`CHATML_TOOLS_TEMPLATE` as its chat template. Every call returns an independent
        object with identical vocabulary and merges. ``decode(encode(s)) == s`` for every NFC-normalized
        string ``s`` (other strings come back NFC-normalized, as with Qwen2.5).
    """
    trained_vocab, merges = _trained_vocab_and_merges()
    vocab = dict(trained_vocab)
    # Control tokens follow the BPE vocabulary, in a fixed order, as in Qwen2.5.
    for token in (*SPECIAL_TOKENS, *CONTROL_TOKENS):
        vocab[token] = len(vocab)
    # Passed as a plain mapping because Qwen2Tokenizer's annotations are narrower than what it accepts:
    # merges must be (left, right) pairs and unk_token may be None (Qwen2.5 has no UNK token).
    options: dict[str, Any] = {
        "vocab": vocab,
        "merges": list(merges),
        "unk_token": None,
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": END_OF_TEXT,
        "clean_up_tokenization_spaces": False,
        "model_max_length": TINY_MODEL_MAX_LENGTH,
        "chat_template": CHATML_TOOLS_TEMPLATE,
    }
    tokenizer = Qwen2Tokenizer(**options)
    tokenizer.add_special_tokens(
        {"additional_special_tokens": [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]}
    )
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in CONTROL_TOKENS])
    return tokenizer
