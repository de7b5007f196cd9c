"""One Polar session result → the fields of one verl ``AgentLoopOutput`` (pure; verl is not imported).

verl's agent loop returns one sequence per sample; the bridge fills it from the session's trace:

=======================  ================================================================================
``prompt_ids``           the chosen trace's ``prompt_token_ids`` (left-cut to ``rollout.prompt_length``)
``response_ids``         its ``response_token_ids`` (cut to ``rollout.response_length``)
``response_mask``        its ``loss_mask``: 1 only on tokens the policy sampled, 0 on tool output and
                         on the chat template's tokens between calls
``response_logprobs``    the behaviour log-probabilities the proxy recorded, 0.0 at mask-0 positions (the
                         trace may hold a placeholder there; verl multiplies, and ``nan * 0`` is ``nan``)
``reward_score``         the session's reward (the evaluator's), so verl's reward loop is skipped
``num_turns``            2 per model call of the session (a prompt side and a reply; verl's single-turn loop
                         reports 2 for its one call)
=======================  ================================================================================

A session that reconstruction split into several traces still gives **one** sample, as verl's batch has one
row per sample and GRPO groups rows by the sample's ``uid`` (``rollout.n`` rows each): an extra row would join
its group and skew the group's baseline. ``multi_trace`` picks the trace, as the slime bridge does: ``longest``
(most trainable tokens, ties to the later trace; the default) or ``last`` (the one that ended the session). The
other traces' trainable tokens are left out and counted (``dropped_traces``, ``dropped_tokens``).

A failed session (``infra_error``, ``cancelled``, no result, no trace) gives reward 0 and a mask of all 0: it
keeps its row, so the group keeps its ``rollout.n`` rows, but teaches nothing. A trace whose loss mask or
log-probabilities differ in length from its response, whose mask is not 0/1, whose sampled tokens lack a finite
log-probability or that has no prompt is refused (``refused_traces``) and never reaches verl; a session left with
no trace is a failed one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Literal

from polar_core.records import TerminalStatus

__all__ = ["MultiTrace", "VerlSample", "convert_session", "failed_sample", "trace_problem"]

MultiTrace = Literal["longest", "last"]

_FAILED = frozenset({TerminalStatus.INFRA_ERROR.value, TerminalStatus.CANCELLED.value})


@dataclasses.dataclass(frozen=True, slots=True)
class VerlSample:
    """What one session gives verl: the ``AgentLoopOutput`` fields and the bridge's bookkeeping.

    Attributes:
        prompt_ids: Prompt token ids.
        response_ids: Response token ids (sampled tokens and what the harness put between calls).
        response_mask: 1 on tokens the policy sampled, else 0; all 0 for a failed session.
        response_logprobs: Behaviour log-probabilities, 0.0 where the mask is 0.
        reward: The reward verl gets (0 for a failed session).
        num_turns: 2 per model call of the session.
        failed: Whether the session is zeroed (failed, or its chosen trace refused).
        status: The session's terminal status (``missing`` without a result).
        session_id: The Polar session (empty without a result).
        task_id: Its task (empty without a result).
        trace_index: The chosen trace's index (-1 without one).
        traces: Traces the session reconstructed into.
        refused_traces: Traces refused for malformed masks or log-probabilities.
        dropped_traces: Other traces with trainable tokens left out (``multi_trace``).
        dropped_tokens: Their trainable tokens.
        truncated_tokens: Prompt and response tokens cut to verl's lengths.
        policy_versions: The policy versions the proxy stamped on the chosen trace's calls.
        error: Why the session failed, when it did.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    reward: float
    num_turns: int
    failed: bool
    status: str
    session_id: str = ""
    task_id: str = ""
    trace_index: int = -1
    traces: int = 0
    refused_traces: int = 0
    dropped_traces: int = 0
    dropped_tokens: int = 0
    truncated_tokens: int = 0
    policy_versions: tuple[str, ...] = ()
    error: str = ""

    def extra_fields(self) -> dict[str, Any]:
        """The bookkeeping as verl ``extra_fields`` (one column each in the batch's ``non_tensor_batch``)."""
        return {
            "polar_task_id": self.task_id,
            "polar_session_id": self.session_id,
            "polar_status": self.status,
            "polar_failed": self.failed,
            "polar_trace_index": self.trace_index,
            "polar_traces": self.traces,
            "polar_refused_traces": self.refused_traces,
            "polar_dropped_traces": self.dropped_traces,
            "polar_dropped_tokens": self.dropped_tokens,
            "polar_truncated_tokens": self.truncated_tokens,
            "polar_policy_versions": list(self.policy_versions),
            "polar_error": self.error,
        }


def trace_problem(trace: Any) -> str | None:
    """Why a ``polar.common.v1.Trace`` cannot be handed to verl, or ``None`` when it can."""
    n = len(trace.response_token_ids)
    if len(trace.loss_mask) != n:
        return f"loss_mask has {len(trace.loss_mask)} entries for {n} response tokens"
    if len(trace.response_logprobs) != n:
        return f"response_logprobs has {len(trace.response_logprobs)} entries for {n} response tokens"
    if any(m not in (0, 1) for m in trace.loss_mask):
        return "loss_mask holds values other than 0 and 1"
    if any(m and not math.isfinite(lp) for m, lp in zip(trace.loss_mask, trace.response_logprobs, strict=True)):
        return "a sampled token's log-probability is not finite"
    if not trace.prompt_token_ids:
        return "no prompt tokens"
    return None


def _choose(traces: Sequence[Any], rule: MultiTrace) -> Any:
    if rule == "last":
        return max(traces, key=lambda t: t.trace_index)
    return max(traces, key=lambda t: (sum(t.loss_mask), t.trace_index))


def failed_sample(
    fallback_prompt_ids: Sequence[int],
    *,
    pad_token_id: int,
    status: str,
    error: str,
    prompt: Sequence[int] | None = None,
    response: Sequence[int] | None = None,
    **counts: Any,
) -> VerlSample:
    """A zeroed sample: reward 0 and a mask of all 0, over the session's own tokens when it has a trace.

    Without one, the prompt is ``fallback_prompt_ids`` (the sample's prompt, tokenized by the loop) and the
    response one pad token, so verl's shapes hold.
    """
    prompt_ids = list(prompt) if prompt else list(fallback_prompt_ids) or [pad_token_id]
    response_ids = list(response) if response else [pad_token_id]
    return VerlSample(
        prompt_ids=prompt_ids,
        response_ids=response_ids,
        response_mask=[0] * len(response_ids),
        response_logprobs=[0.0] * len(response_ids),
        reward=0.0,
        num_turns=int(counts.pop("num_turns", 0)),
        failed=True,
        status=status,
        error=error,
        **counts,
    )


def convert_session(
    result: Any | None,
    *,
    prompt_length: int,
    response_length: int,
    fallback_prompt_ids: Sequence[int],
    pad_token_id: int = 0,
    multi_trace: MultiTrace = "longest",
    error: str = "",
) -> VerlSample:
    """Convert a ``polar.common.v1.SessionResult`` (``None``: the session gave none) into one verl sample.

    Args:
        result: The session's result, or ``None`` when none came (timeout, dropped watch).
        prompt_length: verl's ``rollout.prompt_length``: a longer prompt keeps its last tokens.
        response_length: verl's ``rollout.response_length``: a longer response keeps its first tokens.
        fallback_prompt_ids: The prompt of a failed session without a trace.
        pad_token_id: The tokenizer's pad token (the one-token response of such a session).
        multi_trace: Which trace of a session split into several: ``longest`` or ``last``.
        error: Why ``result`` is ``None``.
    """
    if result is None:
        return failed_sample(fallback_prompt_ids, pad_token_id=pad_token_id, status="missing", error=error)
    status = str(result.status)
    num_turns = 2 * int(result.statistics.completions)
    traces = list(result.traces)
    usable = [t for t in traces if trace_problem(t) is None]
    common: dict[str, Any] = {
        "session_id": str(result.session_id),
        "task_id": str(result.task_id),
        "traces": len(traces),
        "refused_traces": len(traces) - len(usable),
        "num_turns": num_turns,
    }
    if status in _FAILED or not usable:
        reason = str(result.error_message) or (
            f"session ended {status}" if status in _FAILED else "no trace verl can take"
        )
        own = usable[-1] if usable else None
        return failed_sample(
            fallback_prompt_ids,
            pad_token_id=pad_token_id,
            status=status,
            error=reason,
            prompt=list(own.prompt_token_ids)[-prompt_length:] if own else None,
            response=list(own.response_token_ids)[:response_length] if own else None,
            **common,
        )
    chosen = _choose(usable, multi_trace)
    others = [t for t in usable if t is not chosen and sum(t.loss_mask) > 0]
    prompt = list(chosen.prompt_token_ids)
    response = list(chosen.response_token_ids)
    cut = max(0, len(prompt) - prompt_length) + max(0, len(response) - response_length)
    prompt, response = prompt[-prompt_length:], response[:response_length]
    mask = [int(m) for m in chosen.loss_mask[: len(response)]]
    logprobs = [float(lp) if m else 0.0 for m, lp in zip(mask, chosen.response_logprobs[: len(response)], strict=True)]
    return VerlSample(
        prompt_ids=prompt,
        response_ids=response,
        response_mask=mask,
        response_logprobs=logprobs,
        reward=float(result.reward),
        failed=False,
        status=status,
        trace_index=int(chosen.trace_index),
        dropped_traces=len(others),
        dropped_tokens=sum(sum(t.loss_mask) for t in others),
        truncated_tokens=cut,
        policy_versions=tuple(chosen.policy_versions),
        **common,
    )
