"""Per-trace and per-call rewards: mapped to traces, and refused (infra_error) when they do not fit."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from evaluator import Artifacts, EvaluatorService, EvaluatorSettings, EvaluatorSpec, PrepareParams, evaluator_config
from evaluator.trace_rewards import check_trace_rewards, trace_rewards_from_calls
from polar_core.errors import InvalidArgument
from polar_core.records import TerminalStatus, Trace


def _trace(index: int, *calls: str) -> Trace:
    return Trace("s", "t", index, list(calls), [1], [], [], [])


TRACES = (_trace(0, "a", "b"), _trace(1, "c"))


def test_a_trace_gets_the_sum_of_its_calls_rewards() -> None:
    assert trace_rewards_from_calls(TRACES, {"a": 0.25, "b": 0.5, "c": 1.0}) == (0.75, 1.0)
    assert trace_rewards_from_calls(TRACES, {"b": 1.0, "c": 0.0}) == (1.0, 0.0)  # only the last calls


def test_unknown_calls_and_unrewarded_traces_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="in no trace"):
        trace_rewards_from_calls(TRACES, {"a": 1.0, "c": 1.0, "zzz": 1.0})
    with pytest.raises(InvalidArgument, match=r"trace\(s\) \[1\]"):
        trace_rewards_from_calls(TRACES, {"a": 1.0})
    with pytest.raises(InvalidArgument, match="3 trace rewards for 2 traces"):
        check_trace_rewards(TRACES, (1.0, 1.0, 1.0))
    check_trace_rewards((), (1.0,))  # without traces the gateway checks the count against its own


async def test_custom_evaluator_rewards_calls_and_a_wrong_count_is_infra_error(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "calls_eval.py").write_text(
        textwrap.dedent(
            """
            from evaluator import CustomResult

            def per_call(request):
                return CustomResult(1.0, call_rewards={t.call_ids[-1]: 0.5 for t in request.artifacts.traces})

            def too_many(request):
                return CustomResult(1.0, trace_rewards=(1.0,) * (len(request.artifacts.traces) + 1))
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    service = EvaluatorService(evaluator_config(EvaluatorSettings(state_dir=tmp_path / "state")))
    handle = await service.prepare(PrepareParams(spec=EvaluatorSpec("calls_eval:per_call")))
    result = await service.evaluate(handle, Artifacts(traces=TRACES))
    assert (result.status, result.trace_rewards) == (TerminalStatus.RESOLVED, (0.5, 0.5))
    handle = await service.prepare(PrepareParams(spec=EvaluatorSpec("calls_eval:too_many")))
    result = await service.evaluate(handle, Artifacts(traces=TRACES))
    assert result.status is TerminalStatus.INFRA_ERROR
    assert "3 trace rewards for 2 traces" in result.error_message
