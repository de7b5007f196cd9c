"""Reconstruction statistics: how many calls were merged, split (and why), and how exact the contexts are.

These mirror ``polar.common.v1.ReconstructionStats``. They make the asynchronous boundary visible to the
trainer: a high ``mismatched_context_tokens`` share means merged traces condition trainable tokens on a
context that differs from the one they were sampled in (see ``docs/reconstruction.md``).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable
from typing import Any, Self

__all__ = ["ReconstructionStats", "SplitReason"]


class SplitReason:
    """Names used as keys of :attr:`ReconstructionStats.splits_by_reason`."""

    PREFIX_MISMATCH = "prefix_mismatch"
    """No chain's last prompt is a token prefix of the call's prompt (compaction, subagent, rewrite)."""
    REPEATED_PROMPT = "repeated_prompt"
    """No chain qualifies and one ends in a prompt equal to the call's (a retry or a parallel sample)."""
    NO_END_OF_TURN = "no_end_of_turn"
    """The tail after the previous prompt has no end-of-turn token, so the boundary is unsafe."""
    MALFORMED_TAIL = "malformed_tail"
    """The previous sampled response holds an end-of-turn token before its end, so the first one in the tail
    may belong to its rendering: the boundary is ambiguous."""
    INEXACT_CONTEXT = "inexact_context"
    """(``exact`` only) a chain's last prompt prefixes the call's, but the chain's whole sequence does not."""
    POLICY_VERSION = "policy_version"
    """The chosen chain was sampled by another policy version and splitting on versions is enabled."""


@dataclasses.dataclass(slots=True)
class ReconstructionStats:
    """Counters of one reconstruction; add them up with :meth:`combine`.

    Attributes:
        calls: Completions read.
        chains: Traces produced.
        merges: Calls merged into an existing chain (``calls == chains + merges``).
        splits_by_reason: Calls that started a new chain although another chain existed, by
            :class:`SplitReason`.
        mismatched_context_calls: Merged calls whose merged context differs from the prompt they were sampled
            with (only ``prefix-merge`` produces them; review §11.1).
        mismatched_context_tokens: The sampled (trainable) tokens of those calls.
        trainable_tokens: Tokens with loss mask 1 over all traces.
        total_tokens: Prompt and response tokens over all traces: what a trainer processes.
    """

    calls: int = 0
    chains: int = 0
    merges: int = 0
    splits_by_reason: dict[str, int] = dataclasses.field(default_factory=dict)
    mismatched_context_calls: int = 0
    mismatched_context_tokens: int = 0
    trainable_tokens: int = 0
    total_tokens: int = 0

    @property
    def splits(self) -> int:
        """The total number of splits, whatever their reason."""
        return sum(self.splits_by_reason.values())

    def count_split(self, reason: str) -> None:
        """Record one split for ``reason``."""
        self.splits_by_reason[reason] = self.splits_by_reason.get(reason, 0) + 1

    @classmethod
    def combine(cls, parts: Iterable[ReconstructionStats]) -> Self:
        """Return the sum of several reconstructions' statistics."""
        out = cls()
        reasons: Counter[str] = Counter()
        for p in parts:
            out.calls += p.calls
            out.chains += p.chains
            out.merges += p.merges
            reasons.update(p.splits_by_reason)
            out.mismatched_context_calls += p.mismatched_context_calls
            out.mismatched_context_tokens += p.mismatched_context_tokens
            out.trainable_tokens += p.trainable_tokens
            out.total_tokens += p.total_tokens
        out.splits_by_reason = dict(sorted(reasons.items()))
        return out

    def to_dict(self) -> dict[str, Any]:
        """Return the statistics as a JSON-ready object."""
        return dataclasses.asdict(self)
