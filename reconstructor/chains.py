"""Chain building: which completions of one session merge into one trace, and with what interstitials.

A chain is the review's ``z = p_1 ‖ a_1 ‖ u_1 ‖ a_2 ‖ … ‖ a_K`` (equation 8): the first call's prompt, then
each call's raw sampled IDs ``a_m`` (mask 1, behaviour logprobs) separated by interstitial spans ``u_m``
taken from the next prompt (mask 0, logprob 0.0). Sampled IDs are never replaced by a re-tokenised rendering.

Which chains a call may join (it *qualifies* for them):

* ``prefix-merge`` (Polar's rule, equations 5–7): the chain's last prompt ``p_m`` is a strict token prefix of
  the call's prompt.
* ``exact`` (review §11.1): additionally, the chain's whole sequence ``z`` so far is a token prefix of the
  call's prompt, so every trainable token keeps exactly the context it was sampled in.

Among qualifying chains the call joins, in this order of preference: the chain whose last call is the
call's ``parent_call_id``; then the chain with the longest matching prefix; then the most recent chain (the
one whose last call came latest). ``prefer_exact_context`` (off by default, not Polar's rule) inserts
"the merge would be context-exact" after the parent preference.

For ``prefix-merge`` the tail ``t = p_{m+1}[|p_m|:]`` of the chosen chain holds the template's canonical
rendering of ``a_m``, an end-of-turn token and the inserted context. With ``k`` the first end-of-turn
position of ``t``, ``u_m = t[k+1:]`` when ``a_m`` ended with that token and ``t[k:]`` otherwise (equation 7).
When that boundary cannot be found safely the call starts a new chain instead: the tail has no end-of-turn
token, or ``a_m`` holds an end-of-turn token before its end (so the first one in the tail may sit inside the
rendering of ``a_m``). Whether the merged context equals the call's real prompt is computed, not assumed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from polar_core.records import CompletionRecord, ReconstructionStrategy, SplitReason
from reconstructor.prefix import TokenArray, as_tokens, equal_tokens

__all__ = ["Chain", "ChainBuilder", "PreparedCall", "prepare"]


@dataclasses.dataclass(slots=True)
class PreparedCall:
    """A completion with its prompt converted once to an ``int32`` array.

    Prompts are long (up to the context length) and are compared against every open chain, so they are
    compared vectorised; the conversion from a Python list is the one O(prompt) step that is not
    vectorised (~75 M tokens/s), so it happens exactly once per record. Responses and interstitials are
    short; they stay Python lists, which are faster than arrays at that size and are what a trace holds.
    """

    record: CompletionRecord
    prompt: TokenArray

    @classmethod
    def of(cls, record: CompletionRecord) -> PreparedCall:
        """Convert ``record``'s prompt to an array."""
        return cls(record=record, prompt=as_tokens(record.prompt_token_ids))

    @property
    def response(self) -> list[int]:
        """The sampled IDs."""
        return self.record.response_token_ids


def prepare(records: Iterable[CompletionRecord]) -> list[PreparedCall]:
    """Convert every record once; see :class:`PreparedCall`."""
    return [PreparedCall.of(r) for r in records]


@dataclasses.dataclass(slots=True)
class Chain:
    """One trace under construction.

    Attributes:
        calls: The merged calls, in order.
        tokens: The response side so far: ``a_1 ‖ u_1 ‖ a_2 ‖ …``.
        mask: Its loss mask.
        logprobs: Its logprobs (0.0 on interstitials).
        exact_context: Whether every merged call that sampled at least one token sits right after a context
            equal to its own prompt (the contract's definition: it speaks about trainable tokens).
        sequence_exact: Whether that holds for every merged call, including ones that sampled nothing; when
            it does, the chain's sequence is its last prompt followed by its last response.
    """

    calls: list[PreparedCall]
    tokens: list[int]
    mask: list[int]
    logprobs: list[float]
    exact_context: bool = True
    sequence_exact: bool = True
    _context: TokenArray | None = None

    @classmethod
    def start(cls, call: PreparedCall) -> Chain:
        """Open a chain with ``call`` as its first completion."""
        response = call.record.response_token_ids
        return cls(
            calls=[call],
            tokens=list(response),
            mask=[1] * len(response),
            logprobs=list(call.record.response_logprobs),
        )

    @property
    def last(self) -> PreparedCall:
        """The most recently merged call."""
        return self.calls[-1]

    def context(self) -> TokenArray:
        """Return the whole sequence so far, ``p_1 ‖ a_1 ‖ u_1 ‖ … ‖ a_m``, as an array.

        Only inexact chains need it (an exact chain's sequence is its last prompt followed by its last
        response), so it is built lazily and extended with what was appended since it was last built.
        """
        prompt = self.calls[0].prompt
        if self._context is None:
            self._context = prompt
        done = self._context.shape[0] - prompt.shape[0]
        if done < len(self.tokens):
            self._context = np.concatenate([self._context, as_tokens(self.tokens[done:])])
        return self._context

    def append(self, call: PreparedCall, interstitial: list[int], exact: bool) -> None:
        """Append an interstitial span (mask 0, logprob 0.0) and ``call``'s sampled span (mask 1)."""
        response = call.record.response_token_ids
        self.tokens += interstitial
        self.tokens += response
        self.mask += [0] * len(interstitial)
        self.mask += [1] * len(response)
        self.logprobs += [0.0] * len(interstitial)
        self.logprobs += call.record.response_logprobs
        self.calls.append(call)
        self.sequence_exact = self.sequence_exact and exact
        if response:
            self.exact_context = self.exact_context and exact


class _Merge(NamedTuple):
    interstitial: list[int]
    exact: bool


_Candidate = tuple[bool, int, int, Chain]
"""(is the parent, length of the matching prefix, seq of the chain's last call, chain): larger is better."""


class ChainBuilder:
    """Assigns the calls of one session, in seq order, to chains.

    Args:
        strategy: The reconstruction strategy.
        end_of_turn_ids: Token IDs that close an assistant turn; needed by ``prefix-merge`` only.
        split_on_policy_version: Start a new chain when the chosen chain's last call was sampled by a
            different policy version (the default; ``False`` merges across versions).
        prefer_exact_context: (``prefix-merge``) after the parent preference, prefer a chain whose merge
            would be context-exact. Off by default: Polar's rule does not look at context exactness.

    Attributes:
        chains: The chains so far, in order of creation.
        splits: One reason per call that started a chain although a chain existed.
        merges: Calls merged into an existing chain.
        mismatched_calls: Merged calls whose merged context differs from their prompt.
        mismatched_tokens: Sampled tokens of those calls.
        compared_tokens: Prompt tokens compared element-wise (the work measured by ``bench/reconstruct``).
    """

    def __init__(
        self,
        strategy: ReconstructionStrategy,
        end_of_turn_ids: Iterable[int],
        *,
        split_on_policy_version: bool = True,
        prefer_exact_context: bool = False,
    ) -> None:
        self._strategy = strategy
        self._eot = frozenset(int(t) for t in end_of_turn_ids)
        self._split_on_version = split_on_policy_version
        self._prefer_exact = prefer_exact_context and strategy is ReconstructionStrategy.PREFIX_MERGE
        self.chains: list[Chain] = []
        self.splits: list[str] = []
        self.merges = 0
        self.mismatched_calls = 0
        self.mismatched_tokens = 0
        self.compared_tokens = 0

    def add(self, call: PreparedCall) -> None:
        """Merge ``call`` into the preferred qualifying chain, or open a new chain and record why."""
        if self._strategy is ReconstructionStrategy.PER_REQUEST or not self.chains:
            self.chains.append(Chain.start(call))
            return
        candidates, reason = self._candidates(call)
        if not candidates:
            self._split(call, reason)
            return
        if self._prefer_exact:
            plans = [(c, self._plan(c[3], call)) for c in candidates]
            best, plan = max(plans, key=lambda cp: (cp[0][0], _is_exact(cp[1]), cp[0][1], cp[0][2]))
        else:
            best = candidates[0] if len(candidates) == 1 else max(candidates, key=lambda c: c[:3])
            plan = self._plan(best[3], call)
        if isinstance(plan, str):
            self._split(call, plan)
            return
        best[3].append(call, plan.interstitial, plan.exact)
        self.merges += 1
        if not plan.exact:
            self.mismatched_calls += 1
            self.mismatched_tokens += len(call.response)

    def _split(self, call: PreparedCall, reason: str) -> None:
        self.splits.append(reason)
        self.chains.append(Chain.start(call))

    def _candidates(self, call: PreparedCall) -> tuple[list[_Candidate], str]:
        """Return the chains ``call`` qualifies for, and the split reason to use when there are none."""
        parent = call.record.parent_call_id
        prompt = call.prompt
        ids = call.record.prompt_token_ids
        size = len(ids)
        exact_mode = self._strategy is ReconstructionStrategy.EXACT
        found: list[_Candidate] = []
        repeated = inexact = False
        for chain in self.chains:
            last = chain.last
            last_ids = last.record.prompt_token_ids
            n = len(last_ids)
            # Cheap rejections on the lists (no numpy scalar boxing), then one vectorised comparison.
            if n > size or (
                n and (last_ids[0] != ids[0] or last_ids[-1] != ids[n - 1] or last_ids[n >> 1] != ids[n >> 1])
            ):
                continue
            self.compared_tokens += n
            if not equal_tokens(last.prompt, prompt[:n]):
                continue
            if n == size:
                repeated = True  # an identical prompt: a retry or a parallel sample, not a continuation
                continue
            matched = n
            if exact_mode:
                # Exact chains only: their sequence is the last prompt followed by the last response.
                response = last.response
                r = len(response)
                self.compared_tokens += r
                if n + r > size or ids[n : n + r] != response:
                    inexact = True
                    continue
                matched = n + r
            is_parent = parent is not None and last.record.call_id == parent
            found.append((is_parent, matched, last.record.seq, chain))
        # A prompt equal to a chain's last prompt names the call best (a retry or a parallel sample), even
        # when an older chain's last prompt also prefixes it.
        if repeated:
            reason = SplitReason.REPEATED_PROMPT
        elif inexact:
            reason = SplitReason.INEXACT_CONTEXT
        else:
            reason = SplitReason.PREFIX_MISMATCH
        return found, reason

    def _plan(self, chain: Chain, call: PreparedCall) -> _Merge | str:
        """Return how ``call`` would join ``chain``, or the reason it must not."""
        last = chain.last
        if self._split_on_version and last.record.policy_version != call.record.policy_version:
            return SplitReason.POLICY_VERSION
        ids = call.record.prompt_token_ids
        n = len(last.record.prompt_token_ids)
        response = last.response
        if self._strategy is ReconstructionStrategy.EXACT:
            return _Merge(ids[n + len(response) :], exact=True)
        if not self._eot:
            # No end-of-turn ID was given and none could be detected (every response was cut at the token
            # limit): the boundary cannot be found safely, so the call starts a chain of its own.
            return SplitReason.NO_END_OF_TURN
        if not self._eot.isdisjoint(response[:-1]):
            # The rendering of a_m holds an end-of-turn token too: the first one in the tail may sit inside
            # it, so the boundary is ambiguous.
            return SplitReason.MALFORMED_TAIL
        k = self._first_end_of_turn(ids, n)
        if k < 0:
            return SplitReason.NO_END_OF_TURN
        # Skip the template's terminator only when a_m already ends with that very token (equation 7).
        interstitial = ids[k + 1 :] if response and response[-1] == ids[k] else ids[k:]
        return _Merge(interstitial, exact=self._merge_is_exact(chain, call, len(interstitial)))

    def _first_end_of_turn(self, ids: list[int], start: int) -> int:
        """Return the first position at or after ``start`` holding an end-of-turn ID, or -1."""
        if len(self._eot) == 1:
            (eot,) = self._eot
            try:
                return ids.index(eot, start)  # C-level scan that stops at the first hit
            except ValueError:
                return -1
        return next((i for i in range(start, len(ids)) if ids[i] in self._eot), -1)

    def _merge_is_exact(self, chain: Chain, call: PreparedCall, interstitial: int) -> bool:
        """Return whether ``chain``'s sequence followed by the interstitial equals ``call``'s prompt.

        The interstitial is a suffix of the prompt, so the two are equal exactly when the lengths agree and
        the chain's sequence is a prefix of the prompt.
        """
        ids = call.record.prompt_token_ids
        last = chain.last
        if chain.sequence_exact:
            # The sequence is last.prompt ‖ last.response and last.prompt is already known to prefix the
            # prompt: only the (short) sampled span needs comparing.
            n, response = len(last.record.prompt_token_ids), last.response
            if n + len(response) + interstitial != len(ids):
                return False
            self.compared_tokens += len(response)
            return ids[n : n + len(response)] == response
        context = chain.context()
        size = context.shape[0]
        if size + interstitial != len(ids):
            return False
        self.compared_tokens += size
        return equal_tokens(context, call.prompt[:size])


def _is_exact(plan: _Merge | str) -> bool:
    return isinstance(plan, _Merge) and plan.exact
