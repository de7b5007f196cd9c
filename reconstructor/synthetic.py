"""Synthetic agent sessions with known structure, for tests and ``bench/reconstruct``.

Each session renders ChatML-shaped token sequences (``<|im_start|> role \\n … <|im_end|> \\n``) the way a
chat template would: every call's prompt is the whole conversation so far plus an assistant header, the
sampled response ends with ``<|im_end|>`` unless it was cut by the length limit, and the next prompt renders
the previous assistant turn canonically. Optional effects reproduce what breaks reconstruction in real
harnesses:

* non-canonical tokenisations: the template renders a sampled turn with other IDs (same text);
* context compaction: the history is rewritten into a summary, so the next prompt extends nothing;
* independent subagents with their own system prompts, interleaved with the main agent;
* forked subagents (branches) whose history starts with the main agent's history at the fork;
* parallel calls with identical prompts (several samples of one turn), of which one is continued.

Every record carries its ground-truth segment in ``extra["synthetic_segment"]``: the calls that one
append-only history produced (thread, compaction epoch; a parallel sample that was not continued is a
segment of its own).
"""

from __future__ import annotations

import dataclasses
import random

from polar_core.policy_version import INITIAL, format_version
from polar_core.records import CompletionRecord

__all__ = ["ASSISTANT", "IM_END", "IM_START", "SyntheticSpec", "growing_session", "synthetic_session"]

IM_START, IM_END, NL, SYSTEM, USER, ASSISTANT, TOOL = 1, 2, 3, 4, 5, 6, 7
_TEXT_IDS = (100, 50_000)
_HEADER = [IM_START, ASSISTANT, NL]


@dataclasses.dataclass(frozen=True, slots=True)
class SyntheticSpec:
    """Shape of a synthetic session.

    Attributes:
        turns: Model calls of the main agent (parallel samples count once).
        system_tokens: Length of each system prompt.
        response_tokens: Maximum sampled tokens per call (lengths are drawn from 1 to this).
        tool_tokens: Maximum tokens of each tool result.
        retokenize_prob: Chance that the template renders an assistant turn with other IDs than sampled.
        truncate_prob: Chance that a call stops on the length limit (no sampled end-of-turn token).
        compaction_every: Compact the main agent's history every this many turns (0: never).
        subagents: Independent subagents (own system prompt), interleaved with the main agent.
        subagent_turns: Model calls of each subagent (independent or forked).
        forks: Subagents forked from the main agent's history once it has made a call.
        parallel_prob: Chance that a main-agent turn is sampled 2–3 times with the identical prompt; the
            agent continues from one of the samples chosen at random.
        parent_ids: Write ``parent_call_id`` (the call whose history a call continues) on every record.
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
    forks: int = 0
    parallel_prob: float = 0.0
    parent_ids: bool = False


@dataclasses.dataclass(slots=True)
class _Thread:
    name: str
    turns_left: int
    history: list[int]
    epoch: int = 0
    turns_done: int = 0
    parent: str | None = None


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
    main = _Thread("main", spec.turns, _message(SYSTEM, _text(rng, spec.system_tokens)))
    threads = [main]
    threads += [
        _Thread(f"sub{i}", spec.subagent_turns, _message(SYSTEM, _text(rng, spec.system_tokens // 2 + i + 1)))
        for i in range(spec.subagents)
    ]
    for t in threads:
        t.history += _message(USER, _text(rng, 16))
    pending_forks = [_Thread(f"fork{i}", spec.subagent_turns, []) for i in range(spec.forks)]
    records: list[CompletionRecord] = []
    while True:
        if pending_forks and main.turns_done and rng.random() < 0.5:
            fork = pending_forks.pop()
            # A branch: the main agent's history so far, then the subagent's instruction.
            fork.history = [*main.history, *_message(USER, _text(rng, 8))]
            fork.parent = main.parent
            threads.append(fork)
        active = [t for t in threads if t.turns_left > 0]
        if not active:
            if not pending_forks:
                return records
            main.turns_done = max(main.turns_done, 1)  # forks still owed: let them start
            continue
        thread = rng.choice(active)
        records += _turn(rng, spec, thread, session_id, len(records))


def _turn(
    rng: random.Random, spec: SyntheticSpec, thread: _Thread, session_id: str, seq: int
) -> list[CompletionRecord]:
    """Make one turn of ``thread``: one call, or several parallel calls with the identical prompt."""
    prompt = [*thread.history, *_HEADER]
    samples = rng.randint(2, 3) if thread.name == "main" and rng.random() < spec.parallel_prob else 1
    chosen = rng.randrange(samples)
    segment = f"{thread.name}:{thread.epoch}"
    records: list[CompletionRecord] = []
    contents: list[list[int]] = []
    for i in range(samples):
        content = _text(rng, rng.randint(1, spec.response_tokens))
        truncated = rng.random() < spec.truncate_prob
        response = content if truncated else [*content, IM_END]
        call_id = f"{session_id}-c{seq + i}"
        records.append(
            CompletionRecord(
                session_id=session_id,
                call_id=call_id,
                seq=seq + i,
                prompt_token_ids=list(prompt),
                response_token_ids=response,
                response_logprobs=[-round(rng.uniform(0.0, 5.0), 4) for _ in response],
                protocol="openai_chat",
                model="synthetic",
                policy_version=format_version(INITIAL),
                parent_call_id=thread.parent if spec.parent_ids else None,
                finish_reason="length" if truncated else "stop",
                extra={"synthetic_segment": segment if i == chosen else f"{segment}:leaf{seq + i}"},
            )
        )
        contents.append(content)
    thread.turns_left -= 1
    thread.turns_done += 1
    thread.parent = records[chosen].call_id
    rendered = _canonical(rng, contents[chosen], spec.retokenize_prob)
    thread.history = [*prompt, *rendered, IM_END, NL, *_message(TOOL, _text(rng, rng.randint(1, spec.tool_tokens)))]
    if thread.name == "main" and spec.compaction_every and thread.turns_done % spec.compaction_every == 0:
        # Compaction rewrites the history into a summary: the next prompt no longer extends the last one.
        thread.epoch += 1
        thread.history = _message(SYSTEM, _text(rng, spec.system_tokens)) + _message(USER, _text(rng, 24))
    return records


def growing_session(
    rng: random.Random,
    session_id: str,
    *,
    calls: int = 200,
    max_prompt_tokens: int = 32_768,
    system_tokens: int = 1_024,
    response_tokens: int = 48,
) -> list[CompletionRecord]:
    """Generate an append-only session whose prompts grow linearly to ``max_prompt_tokens``.

    Each prompt is the previous prompt, the canonical rendering of the previous assistant turn (equal to the
    sampled IDs) and a tool result sized so that the last prompt has about ``max_prompt_tokens`` tokens.
    This is the benchmark workload of ``bench/reconstruct``.
    """
    step = (max_prompt_tokens - system_tokens) / max(calls - 1, 1)
    history = _message(SYSTEM, _text(rng, system_tokens - 12)) + _message(USER, _text(rng, 6))
    records: list[CompletionRecord] = []
    for seq in range(calls):
        prompt = [*history, *_HEADER]
        content = _text(rng, rng.randint(1, response_tokens))
        response = [*content, IM_END]
        records.append(
            CompletionRecord(
                session_id=session_id,
                call_id=f"{session_id}-c{seq}",
                seq=seq,
                prompt_token_ids=prompt,
                response_token_ids=response,
                response_logprobs=[-round(rng.uniform(0.0, 5.0), 4) for _ in response],
                protocol="openai_chat",
                model="synthetic",
                policy_version=format_version(INITIAL),
                finish_reason="stop",
            )
        )
        # The next prompt adds this turn (content, end-of-turn, newline), a tool message (its content plus 6
        # template tokens) and a header; the tool result is sized to keep the prompts on a straight line.
        target = system_tokens + round((seq + 1) * step)
        tool = max(target - len(prompt) - len(content) - 2 - 6 - len(_HEADER), 1)
        history = [*prompt, *content, IM_END, NL, *_message(TOOL, _text(rng, tool))]
    return records
