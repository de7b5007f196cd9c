"""Synthetic agent sessions with known structure, for tests and ``bench/reconstruct``.

Each session renders ChatML-shaped token sequences (``<|im_start|> role \\n … <|im_end|> \\n``) the way a
chat template would: every call's prompt is the whole conversation so far plus an assistant header, the
sampled response ends with ``<|im_end|>`` unless it was cut by the length limit, and the next prompt renders
the previous assistant turn canonically. Optional effects reproduce what breaks reconstruction in real
harnesses: re-tokenised assistant turns (same text, other IDs), context compaction, and subagents whose
calls interleave with the main agent's. Every record carries its ground-truth segment (thread and
compaction epoch) in ``extra["synthetic_segment"]``.
"""

from __future__ import annotations

import dataclasses
import random

from polar_core.records import CompletionRecord

__all__ = ["ASSISTANT", "IM_END", "IM_START", "SyntheticSpec", "synthetic_session"]

IM_START, IM_END, NL, SYSTEM, USER, ASSISTANT, TOOL = 1, 2, 3, 4, 5, 6, 7
_TEXT_IDS = (100, 50_000)


@dataclasses.dataclass(frozen=True, slots=True)
class SyntheticSpec:
    """Shape of a synthetic session.

    Attributes:
        turns: Model calls of the main agent.
        system_tokens: Length of each system prompt.
        response_tokens: Maximum sampled tokens per call (lengths are drawn from 1 to this).
        tool_tokens: Maximum tokens of each tool result.
        retokenize_prob: Chance that the template renders an assistant turn with other IDs than sampled.
        truncate_prob: Chance that a call stops on the length limit (no sampled end-of-turn token).
        compaction_every: Compact the main agent's history every this many turns (0: never).
        subagents: How many subagents run, interleaved with the main agent.
        subagent_turns: Model calls of each subagent.
    """

    turns: int = 8
    system_tokens: int = 64
    response_tokens: int = 32
    tool_tokens: int = 64
    retokenize_prob: float = 0.0
    truncate_prob: float = 0.0
    compaction_every: int = 0
    subagents: int = 0
    subagent_turns: int = 3


@dataclasses.dataclass(slots=True)
class _Thread:
    name: str
    turns_left: int
    history: list[int]
    epoch: int = 0
    turns_done: int = 0


def _text(rng: random.Random, n: int) -> list[int]:
    return [rng.randint(*_TEXT_IDS) for _ in range(n)]


def _message(role: int, content: list[int]) -> list[int]:
    return [IM_START, role, NL, *content, IM_END, NL]


def _canonical(rng: random.Random, content: list[int], retokenize_prob: float) -> list[int]:
    """Render sampled content as a template would; sometimes with other IDs for the same text."""
    if len(content) < 2 or rng.random() >= retokenize_prob:
        return list(content)
    i = rng.randrange(len(content) - 1)
    # Two sampled tokens re-encode to one merged token: same text, different IDs and length.
    return [*content[:i], rng.randint(*_TEXT_IDS), *content[i + 2 :]]


def synthetic_session(rng: random.Random, spec: SyntheticSpec, session_id: str) -> list[CompletionRecord]:
    """Generate one session's completion records in seq order.

    Args:
        rng: The source of randomness (seed it for reproducible sessions).
        spec: The session's shape.
        session_id: The session id written on every record.

    Returns:
        The records, ``seq`` counting from 0.
    """
    threads = [_Thread("main", spec.turns, _message(SYSTEM, _text(rng, spec.system_tokens)))]
    threads += [
        _Thread(f"sub{i}", spec.subagent_turns, _message(SYSTEM, _text(rng, spec.system_tokens // 2 + i + 1)))
        for i in range(spec.subagents)
    ]
    for t in threads:
        t.history += _message(USER, _text(rng, 16))
    records: list[CompletionRecord] = []
    while active := [t for t in threads if t.turns_left > 0]:
        thread = rng.choice(active)
        records.append(_call(rng, spec, thread, session_id, len(records)))
    return records


def _call(rng: random.Random, spec: SyntheticSpec, thread: _Thread, session_id: str, seq: int) -> CompletionRecord:
    prompt = [*thread.history, IM_START, ASSISTANT, NL]
    content = _text(rng, rng.randint(1, spec.response_tokens))
    truncated = rng.random() < spec.truncate_prob
    response = content if truncated else [*content, IM_END]
    record = CompletionRecord(
        session_id=session_id,
        call_id=f"{session_id}-c{seq}",
        seq=seq,
        prompt_token_ids=prompt,
        response_token_ids=response,
        response_logprobs=[-round(rng.uniform(0.0, 5.0), 4) for _ in response],
        protocol="openai_chat",
        model="synthetic",
        policy_version="v0",
        finish_reason="length" if truncated else "stop",
        extra={"synthetic_segment": f"{thread.name}:{thread.epoch}"},
    )
    thread.turns_left -= 1
    thread.turns_done += 1
    rendered = _canonical(rng, content, spec.retokenize_prob)
    thread.history = [*prompt, *rendered, IM_END, NL, *_message(TOOL, _text(rng, rng.randint(1, spec.tool_tokens)))]
    if thread.name == "main" and spec.compaction_every and thread.turns_done % spec.compaction_every == 0:
        # Compaction rewrites the history into a summary: the next prompt no longer extends the last one.
        thread.epoch += 1
        thread.history = _message(SYSTEM, _text(rng, spec.system_tokens)) + _message(USER, _text(rng, 24))
    return record
