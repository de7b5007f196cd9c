"""Attempts lost to an unreachable dependency do not use up a session's attempts; results keep the exit code."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from polar_core.records import TerminalStatus
from rollout_server.convert import result_from_proto, result_to_proto
from rollout_server.models import SessionState
from rollout_server.testing.fakes import make_result
from rollout_server.tests.test_core import make_env, new_task, settle


async def test_outages_are_retried_past_max_attempts_and_results_keep_the_exit_code(tmp_path: Path) -> None:
    env = await make_env(tmp_path / "r.sqlite3")
    try:
        await env.add_gateway("a", 1)
        await env.core.submit_task(new_task("t", 1))
        # Five attempts lost to outages (more than max_attempts=3), then the harness's own failure, then resolved.
        for _ in range(5):
            await env.add_gateway("a", 1)  # renews its lease
            assert await env.dispatch() == 1
            _, d = env.gateways.started[-1]
            lost = make_result(d, gateway_id="a", status=TerminalStatus.INFRA_ERROR)
            await env.core.report_result(dataclasses.replace(lost, dependency_unavailable=True))
            env.clock.now += 60
        session = (await env.store.task_sessions("t"))[0]
        assert session.state is SessionState.PENDING
        assert session.outages == 5
        assert session.infra_failures == 0
        await env.add_gateway("a", 1)
        assert await env.dispatch() == 1
        _, d = env.gateways.started[-1]
        crashed = make_result(d, gateway_id="a", status=TerminalStatus.INFRA_ERROR)
        await env.core.report_result(dataclasses.replace(crashed, harness_exit_code=3))
        env.clock.now += 60
        await env.add_gateway("a", 1)
        assert await env.dispatch() == 1
        _, d = env.gateways.started[-1]
        assert d.attempt == 7
        await env.core.report_result(dataclasses.replace(make_result(d, gateway_id="a"), harness_exit_code=0))
        await settle(env.core)
        session = (await env.store.task_sessions("t"))[0]
        assert session.state is SessionState.DONE
        assert (session.outages, session.infra_failures) == (5, 1)
        _, results = await env.core.get_task("t")
        assert [(r.status, r.harness_exit_code, r.dependency_unavailable) for r in results] == [
            (TerminalStatus.RESOLVED, 0, False)
        ]
    finally:
        await env.core.close()
        await env.store.close()


async def test_ordinary_infra_errors_still_use_up_attempts(tmp_path: Path) -> None:
    env = await make_env(tmp_path / "r.sqlite3")
    try:
        await env.add_gateway("a", 1)
        await env.core.submit_task(new_task("t", 1))
        for _ in range(3):
            await env.add_gateway("a", 1)  # renews its lease
            assert await env.dispatch() == 1
            _, d = env.gateways.started[-1]
            failed = make_result(d, gateway_id="a", status=TerminalStatus.INFRA_ERROR)
            await env.core.report_result(dataclasses.replace(failed, harness_exit_code=3, error_message="exit 3"))
            env.clock.now += 60
        await settle(env.core)
        session = (await env.store.task_sessions("t"))[0]
        assert session.state is SessionState.DONE
        _, results = await env.core.get_task("t")
        assert results[0].harness_exit_code == 3
        assert result_to_proto(results[0]).harness_exit_code == 3
    finally:
        await env.core.close()
        await env.store.close()


def test_proto_round_trip_keeps_absent_exit_code_absent() -> None:
    record = make_result(session_id="s", status=TerminalStatus.INFRA_ERROR)
    pb = result_to_proto(record)
    assert not pb.HasField("harness_exit_code")
    pb.harness_exit_code = 0
    pb.dependency_unavailable = True
    back = result_from_proto(pb)
    assert back.harness_exit_code == 0
    assert back.dependency_unavailable
