"""The prefix-merge rule written plainly on Python lists: the baselines of ``bench/reconstruct``.

Same rule, same tie-break and the same comparisons as :class:`reconstructor.chains.ChainBuilder` (so both
compare the same number of tokens); only the comparison primitive differs:

* ``loop``: element by element in Python, as a straightforward implementation would write it;
* ``slice``: ``seq[:n] == prefix``, CPython's C-level list comparison (a slice copy plus a compare loop).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from polar_core.records import CompletionRecord

__all__ = ["NaiveResult", "loop_starts_with", "naive_prefix_merge", "slice_starts_with"]

StartsWith = Callable[[list[int], list[int], int], bool]
"""``starts_with(seq, part, offset)``: whether ``seq[offset:offset + len(part)] == part``."""


def loop_starts_with(seq: list[int], part: list[int], offset: int) -> bool:
    """Compare element by element in a Python loop."""
    if offset + len(part) > len(seq):
        return False
    # Deliberately the plain loop a straightforward implementation would write (not all(...)).
    for i in range(len(part)):  # noqa: SIM110
        if part[i] != seq[offset + i]:
            return False
    return True


def slice_starts_with(seq: list[int], part: list[int], offset: int) -> bool:
    """Compare with CPython's list equality on a slice."""
    return seq[offset : offset + len(part)] == part


@dataclasses.dataclass(slots=True)
class _Chain:
    calls: list[CompletionRecord]
    tokens: list[int]
    mask: list[int]
    logprobs: list[float]
    sequence_exact: bool = True
    exact_context: bool = True


@dataclasses.dataclass(slots=True)
class NaiveResult:
    """Chains as call-id lists with their response arrays and exactness, and the tokens compared."""

    groups: list[list[str]]
    exact: list[bool]
    tokens: list[list[int]]
    compared_tokens: int


def naive_prefix_merge(records: Sequence[CompletionRecord], eot: int, starts_with: StartsWith) -> NaiveResult:
    """Reconstruct one session (records in seq order) with prefix-merge on Python lists."""
    chains: list[_Chain] = []
    compared = 0
    for r in records:
        p = r.prompt_token_ids
        best: tuple[bool, int, int] | None = None
        best_chain: _Chain | None = None
        for chain in chains:
            last = chain.calls[-1]
            lp = last.prompt_token_ids
            if len(lp) >= len(p):
                continue
            compared += len(lp)
            if not starts_with(p, lp, 0):
                continue
            key = (r.parent_call_id is not None and last.call_id == r.parent_call_id, len(lp), last.seq)
            if best is None or key > best:
                best, best_chain = key, chain
        if best_chain is None:
            chains.append(
                _Chain([r], list(r.response_token_ids), [1] * len(r.response_token_ids), [*r.response_logprobs])
            )
            continue
        last = best_chain.calls[-1]
        a = last.response_token_ids
        n = len(last.prompt_token_ids)
        tail = p[n:]
        if eot in a[:-1] or eot not in tail:
            chains.append(
                _Chain([r], list(r.response_token_ids), [1] * len(r.response_token_ids), [*r.response_logprobs])
            )
            continue
        k = tail.index(eot)
        inter = tail[k + 1 :] if a and a[-1] == tail[k] else tail[k:]
        if best_chain.sequence_exact:
            compared += len(a)
            exact = n + len(a) + len(inter) == len(p) and starts_with(p, a, n)
        else:
            context = best_chain.calls[0].prompt_token_ids + best_chain.tokens
            compared += len(context)
            exact = len(context) + len(inter) == len(p) and starts_with(p, context, 0)
        best_chain.tokens += [*inter, *r.response_token_ids]
        best_chain.mask += [0] * len(inter) + [1] * len(r.response_token_ids)
        best_chain.logprobs += [0.0] * len(inter) + list(r.response_logprobs)
        best_chain.calls.append(r)
        best_chain.sequence_exact = best_chain.sequence_exact and exact
        if r.response_token_ids:
            best_chain.exact_context = best_chain.exact_context and exact
    return NaiveResult(
        groups=[[c.call_id for c in ch.calls] for ch in chains],
        exact=[ch.exact_context for ch in chains],
        tokens=[ch.tokens for ch in chains],
        compared_tokens=compared,
    )
