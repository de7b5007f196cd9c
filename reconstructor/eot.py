"""Finding the end-of-turn token IDs that close an assistant turn in the chat template.

Prefix merging (review equation 7) cuts the interstitial after the first end-of-turn token of the tail, so
it must know which IDs those are. They come, in order of preference, from the caller, from a tokenizer
directory, or from the completions themselves (the token most sampled responses end with).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from polar_core.records import CompletionRecord
from reconstructor.errors import EndOfTurnUnknown

__all__ = ["KNOWN_END_OF_TURN_TOKENS", "detect_end_of_turn_ids", "end_of_turn_ids_from_tokenizer"]

KNOWN_END_OF_TURN_TOKENS: tuple[str, ...] = (
    "<|im_end|>",  # ChatML: Qwen, SmolLM, many others
    "<|eot_id|>",  # Llama 3
    "<end_of_turn>",  # Gemma
    "<|end|>",  # Phi-3, gpt-oss
    "<|eot|>",  # Llama 4
)
"""Template turn terminators recognised in a tokenizer's vocabulary."""

_UNFINISHED = frozenset({"length", "abort", "max_tokens", "cancelled"})


def detect_end_of_turn_ids(records: Iterable[CompletionRecord]) -> tuple[int, ...]:
    """Return the end-of-turn ID that the completions' finished responses end with, or ``()``.

    Only responses that stopped on their own (not cut by a length limit or an abort) are considered, and
    the most common last token is accepted only when at least half of them end with it; stop strings
    make a few responses end elsewhere, but a majority vote keeps a wrong guess out.
    """
    last_tokens = Counter(
        r.response_token_ids[-1] for r in records if r.response_token_ids and r.finish_reason not in _UNFINISHED
    )
    if not last_tokens:
        return ()
    token, count = last_tokens.most_common(1)[0]
    return (token,) if 2 * count >= last_tokens.total() else ()


def end_of_turn_ids_from_tokenizer(path: Path) -> tuple[int, ...]:
    """Return the end-of-turn IDs named by a Hugging Face tokenizer directory (or ``tokenizer.json``).

    Known terminators present in the vocabulary are kept; when ``tokenizer_config.json`` carries a chat
    template, only those the template writes are kept, since only those can close a rendered turn. Without
    a known terminator, the configured ``eos_token`` is used.

    Raises:
        EndOfTurnUnknown: The directory has no ``tokenizer.json`` or names no usable token.
    """
    directory = path.parent if path.is_file() else path
    tokenizer_file = path if path.is_file() else path / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise EndOfTurnUnknown(f"no tokenizer.json at {path}")
    vocab = _vocabulary(tokenizer_file)
    config = _read_json(directory / "tokenizer_config.json")
    template = config.get("chat_template")
    template_text = template if isinstance(template, str) else json.dumps(template or "")
    names = [t for t in KNOWN_END_OF_TURN_TOKENS if t in vocab]
    if template:
        names = [t for t in names if t in template_text]
    if not names:
        eos = config.get("eos_token")
        eos_name = eos.get("content") if isinstance(eos, dict) else eos
        if isinstance(eos_name, str) and eos_name in vocab:
            names = [eos_name]
    if not names:
        raise EndOfTurnUnknown(f"the tokenizer at {path} names no end-of-turn token")
    return tuple(vocab[n] for n in names)


def _vocabulary(tokenizer_file: Path) -> dict[str, int]:
    # Imported here: the tokenizers wheel is large and only the CLI path needs it.
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    vocab: dict[str, int] = tokenizer.get_vocab(with_added_tokens=True)
    return vocab


def _read_json(path: Path) -> dict[str, object]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}
