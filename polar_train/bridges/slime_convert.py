"""Polar session results → slime ``Sample`` objects, one per session, filled in place.

slime's data source hands out a group as ``n_samples_per_prompt`` deep copies of the prompt sample (its
``group_index`` and ``index`` set); the bridge fills copy ``i`` from the session with ``sample_index`` ``i``:

============================  =====================================================================
``tokens``                    the chosen trace's ``prompt_token_ids + response_token_ids``
``response_length``           ``len(response_token_ids)``
``loss_mask``                 the trace's (1 only on tokens the policy sampled)
``rollout_log_probs``         the trace's behaviour log-probabilities (0.0 at mask-0 positions)
``reward``                    the session's reward
``status``                    ``COMPLETED``; ``TRUNCATED`` for ``agent_timeout``; ``FAILED`` for ``infra_error``,
                              a missing result or a refused trace; ``ABORTED`` for ``cancelled``
``weight_versions``           the policy versions the proxy stamped on the trace's calls
``metadata``                  ``policy_version`` (the oldest call's, an int), ``policy_lag``, ``group_id``,
                              ``polar_task_id``, ``polar_session_id``, ``polar_status``, ``polar_trace_index``,
                              ``polar_traces``
============================  =====================================================================

A session that reconstruction split into several traces gives **one** sample: slime normalises rewards per group
by reshaping them to ``n_samples_per_prompt`` columns, which holds only when every group has exactly that many
samples, so splitting a session into several samples would silently merge groups. ``multi_trace`` picks the
trace: ``longest`` (most trainable tokens, ties to the later trace; the default: the session's credit goes to as
many of its own sampled tokens as possible) or ``last`` (the one that ended the session).

Failed and aborted sessions are zeroed: reward 0, loss mask all 0, ``remove_sample`` set. One that has no trace
at all borrows a sibling's prompt tokens, its last token standing as a one-token masked response, so slime's
shapes hold. A trace whose loss mask or log-probabilities disagree in length with its response (or whose mask
is not 0/1) is refused: it never reaches slime, its session is zeroed, and :class:`BridgeCounters` counts it.
A trainable sample more than ``max_policy_lag`` versions behind the fleet when handed over keeps its reward (the
group's baseline) but has its loss mask zeroed, and is counted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from polar.common.v1 import session_pb2, trace_pb2

from polar_core.policy_version import INITIAL, parse_version
from polar_core.records import TerminalStatus
from polar_train.bridges.slime_settings import MultiTrace

__all__ = ["BridgeCounters", "fill_group", "trace_problem"]

_FAILED = {TerminalStatus.INFRA_ERROR.value: "FAILED", TerminalStatus.CANCELLED.value: "ABORTED"}
_TRUNCATED = {TerminalStatus.AGENT_TIMEOUT.value}


@dataclasses.dataclass(slots=True)
class BridgeCounters:
    """What the bridge did, over the life of the process (returned to slime as rollout metrics too).

    Attributes:
        submitted_groups: Groups reserved from the data source and submitted.
        reattached_groups: Reserved groups followed again after a restart.
        replayed_groups: Groups handed to slime again when a restart replayed a recorded rollout.
        consumed_groups: Groups handed to slime for the first time.
        discarded_groups: Groups that ended without a usable trace (replaced, never handed over).
        skipped_reservations: Groups the data source handed out again after a restart (already reserved).
        refused_traces: Traces refused because mask, log-probabilities and response disagree in length.
        zeroed_samples: Samples zeroed (failed, aborted, missing, refused).
        stale_samples: Trainable samples masked out for being beyond ``max_policy_lag``.
        multi_trace_sessions: Sessions that reconstruction split into several traces.
    """

    submitted_groups: int = 0
    reattached_groups: int = 0
    replayed_groups: int = 0
    consumed_groups: int = 0
    discarded_groups: int = 0
    skipped_reservations: int = 0
    refused_traces: int = 0
    zeroed_samples: int = 0
    stale_samples: int = 0
    multi_trace_sessions: int = 0

    def as_metrics(self) -> dict[str, int]:
        """The counters as slime rollout metrics (``polar/<name>``)."""
        return {f"polar/{f.name}": getattr(self, f.name) for f in dataclasses.fields(self)}


def trace_problem(trace: trace_pb2.Trace) -> str | None:
    """Why ``trace`` must not reach the trainer, or ``None`` when it may."""
    n = len(trace.response_token_ids)
    if len(trace.loss_mask) != n or len(trace.response_logprobs) != n:
        return (
            f"response {n} tokens, loss_mask {len(trace.loss_mask)}, response_logprobs {len(trace.response_logprobs)}"
        )
    if any(m not in (0, 1) for m in trace.loss_mask):
        return "loss_mask holds values other than 0 and 1"
    if not trace.prompt_token_ids:
        return "no prompt tokens"
    return None


def _choose(traces: Sequence[trace_pb2.Trace], rule: MultiTrace) -> trace_pb2.Trace:
    if rule == "last":
        return max(traces, key=lambda t: t.trace_index)
    return max(traces, key=lambda t: (sum(t.loss_mask), t.trace_index))


def _oldest_version(trace: trace_pb2.Trace) -> int:
    return min((parse_version(v) for v in trace.policy_versions), default=INITIAL)


def _borrowed_prompt(results: Mapping[int, session_pb2.SessionResult]) -> list[int] | None:
    """A valid trace's prompt tokens from the group, for a session that has none of its own."""
    for index in sorted(results):
        for trace in results[index].traces:
            if trace_problem(trace) is None and len(trace.prompt_token_ids) >= 2:
                return list(trace.prompt_token_ids)
    return None


def _set_status(sample: Any, name: str) -> None:
    sample.status = type(sample).Status[name]


def _zero(sample: Any, status: str, counters: BridgeCounters) -> None:
    sample.reward = 0.0
    sample.loss_mask = [0] * sample.response_length
    sample.remove_sample = True
    _set_status(sample, status)
    counters.zeroed_samples += 1


def _fill_one(
    sample: Any,
    result: session_pb2.SessionResult | None,
    *,
    prompt: list[int],
    current_version: int,
    max_policy_lag: int,
    multi_trace: MultiTrace,
    counters: BridgeCounters,
) -> None:
    status_name = result.status if result is not None else "missing"
    traces = list(result.traces) if result is not None else []
    refused = [t for t in traces if trace_problem(t) is not None]
    counters.refused_traces += len(refused)
    counters.multi_trace_sessions += len(traces) > 1
    chosen = _choose(traces, multi_trace) if traces and not refused else None
    meta = {
        "group_id": sample.metadata.get("group_id"),
        "polar_session_id": result.session_id if result is not None else "",
        "polar_status": status_name,
        "polar_traces": len(traces),
    }
    if chosen is None:  # a one-token masked response on a sibling's prompt keeps slime's shapes
        sample.tokens = list(prompt)
        sample.response_length = 1
        sample.rollout_log_probs = [0.0]
        sample.weight_versions = []
        meta.update(policy_version=INITIAL, policy_lag=0, polar_trace_index=-1)
    else:
        sample.tokens = [*chosen.prompt_token_ids, *chosen.response_token_ids]
        sample.response_length = len(chosen.response_token_ids)
        sample.rollout_log_probs = list(chosen.response_logprobs)
        sample.weight_versions = list(chosen.policy_versions)
        oldest = _oldest_version(chosen)
        lag = max(int(chosen.policy_lag), current_version - oldest, 0)
        meta.update(policy_version=oldest, policy_lag=lag, polar_trace_index=int(chosen.trace_index))
    sample.metadata.update(meta)
    sample.loss_mask = list(chosen.loss_mask) if chosen is not None else [0]
    sample.reward = float(result.reward) if result is not None else 0.0
    if chosen is None:
        _zero(sample, "FAILED" if status_name != TerminalStatus.CANCELLED.value else "ABORTED", counters)
        return
    if status_name in _FAILED:
        _zero(sample, _FAILED[status_name], counters)
        return
    _set_status(sample, "TRUNCATED" if status_name in _TRUNCATED else "COMPLETED")
    if meta["policy_lag"] > max_policy_lag and any(sample.loss_mask):
        sample.loss_mask = [0] * sample.response_length
        sample.remove_sample = True
        sample.metadata["polar_stale"] = True
        counters.stale_samples += 1


def fill_group(
    samples: Sequence[Any],
    results: Mapping[int, session_pb2.SessionResult],
    *,
    group_id: int,
    task_id: str,
    current_version: int,
    max_policy_lag: int,
    multi_trace: MultiTrace,
    counters: BridgeCounters,
) -> bool:
    """Fill the group's samples in place from its session results (by ``sample_index``).

    Returns:
        False, leaving the samples untouched, when no session of the group has a usable trace (nothing to borrow
        a prompt from: the caller discards the group); True otherwise.
    """
    prompt = _borrowed_prompt(results)
    if prompt is None:
        return False
    for index, sample in enumerate(samples):
        if not isinstance(sample.metadata, dict):
            sample.metadata = {}
        sample.metadata.update(group_id=group_id, polar_task_id=task_id)
        _fill_one(
            sample,
            results.get(index),
            prompt=prompt,
            current_version=current_version,
            max_policy_lag=max_policy_lag,
            multi_trace=multi_trace,
            counters=counters,
        )
    return True
