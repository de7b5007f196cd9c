"""Chain building: which completions of one session merge into one trace, and with what interstitials.

A chain is the review's ``z = p_1 ‖ a_1 ‖ u_1 ‖ a_2 ‖ … ‖ a_K`` (equation 8): the first call's prompt, then
each call's raw sampled IDs ``a_m`` (mask 1, behaviour logprobs) separated by interstitial spans ``u_m``
taken from the next prompt (mask 0, logprob 0.0). Sampled IDs are never replaced by a re-tokenised rendering.

Two merge rules are implemented:

* ``prefix-merge`` (Polar's rule, equations 5–7): a call joins a chain whose last prompt ``p_m`` is a
  strict token prefix of its prompt. The tail ``t = p_{m+1}[|p_m|:]`` holds the template's canonical
  rendering of ``a_m``, an end-of-turn token and the inserted context; ``u_m`` starts after the first
  end-of-turn token when ``a_m`` ended with one and at it otherwise. A tail without an end-of-turn token is
  an unsafe boundary and the call starts a new chain. Whether the merged context equals the call's real
  prompt is checked and reported (``exact_context``), not assumed.
* ``exact``: a call joins a chain only when the chain's whole sequence ``z`` is a token prefix of its
  prompt, so every trainable token keeps exactly the context it was sampled in (review §11.1).

When several chains qualify, the candidate is chosen by: the chain ending in the call's ``parent_call_id``;
then a chain whose merge would be context-exact; then the longest last prompt; then the most recent chain.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt

from polar_core.records import CompletionRecord, ReconstructionStrategy
from reconstructor.errors import EndOfTurnUnknown
from reconstructor.prefix import TokenArray, as_tokens, find_first_of, is_prefix
from reconstructor.stats import SplitReason

__all__ = ["Chain", "ChainBuilder", "PreparedCall"]

FloatArray = npt.NDArray[np.float64]


@dataclasses.dataclass(slots=True)
class PreparedCall:
    """A completion with its token sequences converted once to arrays."""

    record: CompletionRecord
    prompt: TokenArray
    response: TokenArray
    logprobs: FloatArray

    @classmethod
    def of(cls, record: CompletionRecord) -> PreparedCall:
        """Convert ``record``'s token lists to arrays."""
        return cls(
            record=record,
            prompt=as_tokens(record.prompt_token_ids),
            response=as_tokens(record.response_token_ids),
            logprobs=np.asarray(record.response_logprobs, dtype=np.float64),
        )


@dataclasses.dataclass(slots=True)
class Chain:
    """One trace under construction."""

    calls: list[PreparedCall]
    prompt: TokenArray
    context: TokenArray
    """The whole sequence so far: the first prompt, sampled spans and interstitials."""
    tokens: list[TokenArray]
    mask: list[npt.NDArray[np.int8]]
    logprobs: list[FloatArray]
    exact_context: bool = True

    @classmethod
    def start(cls, call: PreparedCall) -> Chain:
        """Open a chain with ``call`` as its first completion."""
        return cls(
            calls=[call],
            prompt=call.prompt,
            context=np.concatenate([call.prompt, call.response]),
            tokens=[call.response],
            mask=[np.ones(call.response.shape[0], dtype=np.int8)],
            logprobs=[call.logprobs],
        )

    @property
    def last(self) -> PreparedCall:
        """The most recently merged call."""
        return self.calls[-1]

    def append(self, call: PreparedCall, interstitial: TokenArray, exact: bool) -> None:
        """Append an interstitial span (mask 0) and ``call``'s sampled span (mask 1)."""
        n = interstitial.shape[0]
        self.tokens += [interstitial, call.response]
        self.mask += [np.zeros(n, dtype=np.int8), np.ones(call.response.shape[0], dtype=np.int8)]
        self.logprobs += [np.zeros(n, dtype=np.float64), call.logprobs]
        self.context = np.concatenate([self.context, interstitial, call.response])
        self.calls.append(call)
        self.exact_context = self.exact_context and exact

    def response_arrays(self) -> tuple[TokenArray, npt.NDArray[np.int8], FloatArray]:
        """Return the response tokens, loss mask and logprobs as single arrays."""
        return np.concatenate(self.tokens), np.concatenate(self.mask), np.concatenate(self.logprobs)


@dataclasses.dataclass(frozen=True, slots=True)
class _Merge:
    interstitial: TokenArray
    exact: bool


class ChainBuilder:
    """Assigns the calls of one session, in seq order, to chains.

    Args:
        strategy: The reconstruction strategy.
        end_of_turn_ids: Token IDs that close an assistant turn; needed by ``prefix-merge`` only.
        split_on_policy_version: Start a new chain when the candidate chain's last call was sampled by a
            different policy version.
    """

    def __init__(
        self,
        strategy: ReconstructionStrategy,
        end_of_turn_ids: TokenArray,
        *,
        split_on_policy_version: bool = False,
    ) -> None:
        self._strategy = strategy
        self._eot = end_of_turn_ids
        self._split_on_version = split_on_policy_version
        self.chains: list[Chain] = []
        self.splits: list[str] = []
        self.merges = 0
        self.mismatched_calls = 0
        self.mismatched_tokens = 0

    def add(self, call: PreparedCall) -> None:
        """Merge ``call`` into the best qualifying chain or open a new one."""
        if self._strategy is ReconstructionStrategy.PER_REQUEST or not self.chains:
            self.chains.append(Chain.start(call))
            return
        first_reason: str | None = None
        for chain, context_is_prefix in self._candidates(call):
            outcome = self._plan(chain, call, context_is_prefix)
            if isinstance(outcome, str):
                first_reason = first_reason or outcome
                continue
            chain.append(call, outcome.interstitial, outcome.exact)
            self.merges += 1
            if not outcome.exact:
                self.mismatched_calls += 1
                self.mismatched_tokens += int(call.response.shape[0])
            return
        if first_reason is None:
            first_reason = self._unmatched_reason(call)
        self.splits.append(first_reason)
        self.chains.append(Chain.start(call))

    def _candidates(self, call: PreparedCall) -> list[tuple[Chain, bool]]:
        """Return the chains ``call`` may join, best first, each with whether its context prefixes the call."""
        parent = call.record.parent_call_id
        scored: list[tuple[bool, bool, int, int, Chain]] = []
        for order, chain in enumerate(self.chains):
            # The last prompt is a prefix of the chain's context, so this cheap test also gates ``exact``.
            if not is_prefix(chain.last.prompt, call.prompt):
                continue
            context_is_prefix = is_prefix(chain.context, call.prompt)
            if self._strategy is ReconstructionStrategy.EXACT and not context_is_prefix:
                continue
            is_parent = parent is not None and chain.last.record.call_id == parent
            scored.append((is_parent, context_is_prefix, chain.last.prompt.shape[0], order, chain))
        scored.sort(key=lambda s: s[:4], reverse=True)
        return [(s[4], s[1]) for s in scored]

    def _plan(self, chain: Chain, call: PreparedCall, context_is_prefix: bool) -> _Merge | str:
        """Return how ``call`` would join ``chain``, or the reason it cannot."""
        if self._split_on_version and chain.last.record.policy_version != call.record.policy_version:
            return SplitReason.POLICY_VERSION
        if self._strategy is ReconstructionStrategy.EXACT:
            return _Merge(call.prompt[chain.context.shape[0] :], exact=True)
        if self._eot.shape[0] == 0:
            raise EndOfTurnUnknown(
                "prefix-merge needs end-of-turn token IDs: pass them, or a tokenizer that names them",
                details={"session_id": call.record.session_id},
            )
        last_prompt = chain.last.prompt
        tail = call.prompt[last_prompt.shape[0] :]
        if tail.shape[0] == 0:
            return SplitReason.REPEATED_PROMPT
        k = find_first_of(tail, self._eot)
        if k < 0:
            return SplitReason.NO_END_OF_TURN
        response = chain.last.response
        ends_with_eot = response.shape[0] > 0 and bool(np.isin(response[-1], self._eot))
        interstitial = tail[k + 1 :] if ends_with_eot else tail[k:]
        # The merged context is context ‖ interstitial and the interstitial is a suffix of the prompt, so the
        # two are equal exactly when the lengths agree and the context prefixes the prompt.
        exact = context_is_prefix and chain.context.shape[0] + interstitial.shape[0] == call.prompt.shape[0]
        return _Merge(interstitial, exact=exact)

    def _unmatched_reason(self, call: PreparedCall) -> str:
        """Name why no chain qualified at all."""
        if self._strategy is ReconstructionStrategy.EXACT and any(
            is_prefix(c.last.prompt, call.prompt, strict=True) for c in self.chains
        ):
            return SplitReason.INEXACT_CONTEXT
        if any(np.array_equal(c.last.prompt, call.prompt) for c in self.chains):
            return SplitReason.REPEATED_PROMPT
        return SplitReason.PREFIX_MISMATCH
