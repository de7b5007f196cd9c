"""From one Polar group's session results to TRL's completion rows (pure; no TRL, no grpc).

TRL's ``GRPOTrainer`` wants exactly one completion per prompt row and ``num_generations`` rows per group, each
with its ``prompt_ids``, ``completion_ids``, behaviour ``logprobs`` and ``env_mask`` (1 on tokens the model
sampled, 0 on tool results and other tokens it did not write). A Polar session gives a reward and one or more
traces. The rules, stated once:

* A session reconstructed into **several traces** (its calls did not extend one another: a compaction, a
  sub-agent, an edited history) contributes **one** of them, chosen by ``multi_trace``: ``last`` (default: the
  chain that ended the session, the one the reward judged) or ``longest`` (the most mask-1 tokens). The others
  are counted (``extra_traces``) and not trained on; the session's reward goes with the chosen trace.
* A **failed** session (``infra_error``, ``cancelled``, missing from the task's results, or without a trace
  with a sampled token) becomes a placeholder row: one end-of-turn token, mask all 0 (no gradient), reward
  ``failed_reward`` (0.0 by default; ``None`` makes TRL leave the row out of its group's baseline).
* A trace whose ``loss_mask`` or ``response_logprobs`` differ in length from its response tokens is
  **refused** (``polar_core.records.Trace`` raises on it) and counted (``refused_traces``); a session left
  without a usable trace is failed as above.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

from polar_client.tensors import as_trace
from polar_core.errors import InvalidArgument
from polar_core.policy_version import parse_version
from polar_core.records import TerminalStatus, Trace

__all__ = ["Completion", "GroupRows", "MultiTrace", "group_rows"]

MultiTrace = Literal["last", "longest"]

_FAILED = frozenset({TerminalStatus.INFRA_ERROR.value, TerminalStatus.CANCELLED.value})


@dataclasses.dataclass(frozen=True, slots=True)
class Completion:
    """One row of TRL's generation batch.

    Attributes:
        prompt_ids: The tokens the model was called with (the proxy's rendering of the conversation).
        completion_ids: The trace's response tokens (sampled tokens and, in multi-turn traces, tool results).
        logprobs: The behaviour log-probability of each response token (0.0 where the mask is 0).
        env_mask: The trace's loss mask: 1 on sampled tokens, 0 elsewhere.
        reward: The session's reward (``failed_reward`` for a failed session).
        status: The session's terminal status; ``missing`` when the task gave no result for the row and
            ``refused`` when every trace was refused.
        policy_version: The oldest policy version among the chosen trace's calls (-1 for a placeholder).
        session_id: The session ("" for a missing one).
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    env_mask: list[int]
    reward: float | None
    status: str
    policy_version: int
    session_id: str

    @property
    def trainable(self) -> bool:
        """Whether any token of the row can carry loss."""
        return any(self.env_mask)


@dataclasses.dataclass(frozen=True, slots=True)
class GroupRows:
    """A group's rows and what was left out on the way.

    Attributes:
        rows: ``group_size`` completions, in sample order.
        failed_sessions: Rows that are placeholders (failed, missing or refused sessions).
        refused_traces: Traces refused for inconsistent lengths.
        extra_traces: Traces of multi-trace sessions that were not chosen.
    """

    rows: tuple[Completion, ...]
    failed_sessions: int
    refused_traces: int
    extra_traces: int


def _placeholder(
    prompt_ids: Sequence[int], end_token_id: int, reward: float | None, status: str, sid: str
) -> Completion:
    # TRL indexes the last completion token (its truncation check), so a placeholder has one token, masked.
    return Completion(list(prompt_ids), [end_token_id], [0.0], [0], reward, status, -1, sid)


def _choose(traces: Sequence[Trace], multi_trace: MultiTrace) -> Trace:
    if multi_trace == "longest":
        return max(traces, key=lambda t: (sum(t.loss_mask), t.trace_index))
    return max(traces, key=lambda t: t.trace_index)


def _oldest_version(trace: Trace) -> int:
    return min((parse_version(v) for v in trace.policy_versions), default=0)


def group_rows(
    results: Sequence[Any],
    *,
    group_size: int,
    fallback_prompt_ids: Sequence[int],
    end_token_id: int,
    multi_trace: MultiTrace = "last",
    failed_reward: float | None = 0.0,
) -> GroupRows:
    """Turn one task's session results (``polar.common.v1.SessionResult`` messages) into ``group_size`` rows.

    Results are ordered by ``sample_index`` (then session id); a result repeated for the same session keeps the
    last one; missing samples become placeholder rows.

    Args:
        results: The task's results, as ``WatchTask`` yields them.
        group_size: Rows to return (TRL's ``num_generations``).
        fallback_prompt_ids: Prompt tokens of placeholder rows (TRL needs a prompt on every row).
        end_token_id: The one completion token of a placeholder row.
        multi_trace: Which trace a multi-trace session contributes (see the module docstring).
        failed_reward: The reward of placeholder rows.
    """
    by_session: dict[str, Any] = {}
    for result in results:
        by_session[result.session_id] = result
    ordered = sorted(by_session.values(), key=lambda r: (int(r.sample_index), r.session_id))[:group_size]
    rows: list[Completion] = []
    failed = refused = extra = 0
    for result in ordered:
        traces: list[Trace] = []
        refused_here = 0
        for message in result.traces:
            try:
                traces.append(as_trace(message))
            except InvalidArgument:
                refused_here += 1
        refused += refused_here
        usable = [t for t in traces if t.response_token_ids and any(t.loss_mask)]
        if result.status in _FAILED or not usable:
            status = "refused" if result.status not in _FAILED and refused_here and not traces else result.status
            rows.append(_placeholder(fallback_prompt_ids, end_token_id, failed_reward, status, result.session_id))
            failed += 1
            continue
        trace = _choose(usable, multi_trace)
        extra += len(traces) - 1
        rows.append(
            Completion(
                prompt_ids=list(trace.prompt_token_ids),
                completion_ids=list(trace.response_token_ids),
                # Mask-0 positions may hold a placeholder (inf, nan); TRL should never see one.
                logprobs=[
                    float(x) if m else 0.0 for x, m in zip(trace.response_logprobs, trace.loss_mask, strict=True)
                ],
                env_mask=[int(m) for m in trace.loss_mask],
                reward=float(result.reward),
                status=str(result.status),
                policy_version=_oldest_version(trace),
                session_id=str(result.session_id),
            )
        )
    while len(rows) < group_size:
        rows.append(_placeholder(fallback_prompt_ids, end_token_id, failed_reward, "missing", ""))
        failed += 1
    return GroupRows(tuple(rows), failed, refused, extra)
