"""``polar submit`` and ``polar status``: talk to a running rollout server.

The client package is imported when a command runs, not when ``polar`` builds its parser, so the other
subcommands never pay for (or depend on) it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import grpc
from google.protobuf import json_format
from polar.common.v1 import status_pb2

__all__ = ["add_parser"]


def _connection(args: argparse.Namespace) -> tuple[str, str]:
    from polar_client.settings import ClientSettings

    defaults = ClientSettings()
    return args.server or defaults.server, args.token if args.token is not None else defaults.token


def _status_name(value: int) -> str:
    return str(status_pb2.TaskStatus.Name(value)).removeprefix("TASK_STATUS_").lower()  # type: ignore[arg-type]


async def _submit(args: argparse.Namespace) -> int:
    from polar_client import RolloutClient, load_task

    server, token = _connection(args)
    task = load_task(args.task)
    if args.samples is not None:
        task.num_samples = args.samples
    async with RolloutClient(server, token=token) as client:
        reply = await client.submit(task, task_timeout_s=args.task_timeout)
        note = " (already submitted)" if reply.already_existed else ""
        print(f"task {reply.task_id}: {_status_name(reply.task.status)}, {reply.task.sessions_total} sessions{note}")
        if not args.watch:
            return 0
        async for result in client.watch(reply.task_id):
            print(f"  {result.session_id}  {result.status:<14} reward={result.reward:g}  attempt={result.attempt}")
        info = (await client.get(reply.task_id, summary_only=True)).task
        print(f"task {reply.task_id}: {_status_name(info.status)}, mean reward {info.mean_reward:.3f}")
    return 0


def _row(info: Any) -> str:
    return (
        f"{info.task.task_id:<36} {_status_name(info.status):<10} {info.sessions_done:>4}/{info.sessions_total:<4} "
        f"usable={info.sessions_usable:<4} reward={info.mean_reward:.3f}"
    )


async def _status(args: argparse.Namespace) -> int:
    from polar_client import RolloutClient

    server, token = _connection(args)
    async with RolloutClient(server, token=token) as client:
        if args.task_id:
            reply = await client.get(args.task_id, summary_only=not args.results)
            if args.json:
                print(json.dumps(json_format.MessageToDict(reply, preserving_proto_field_name=True), indent=2))
                return 0
            info = reply.task
            print(_row(info))
            st = info.statistics
            print(f"  by status: {dict(info.sessions_by_status)}")
            print(
                f"  duration p50={st.session_duration_seconds.p50:.1f}s calls mean={st.calls.mean:.1f} "
                f"chains mean={st.chains.mean:.1f} policy age mean={st.policy_age.mean:.2f}"
            )
            print(
                f"  dropped={st.sessions_dropped} retried={st.sessions_retried} truncated={st.sessions_truncated} "
                f"dead letters={st.deliveries_dead_lettered}"
            )
            for r in reply.session_results:
                print(f"  {r.session_id}  {r.status:<14} reward={r.reward:g}")
            return 0
        page = await client.list(page_size=args.limit)
        if args.json:
            print(json.dumps(json_format.MessageToDict(page, preserving_proto_field_name=True), indent=2))
            return 0
        for info in page.tasks:
            print(_row(info))
    return 0


def _run(coro: Any) -> int:
    try:
        return int(asyncio.run(coro))
    except grpc.aio.AioRpcError as exc:
        print(f"polar: error: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", default=None, help="rollout server host:port (default $POLAR_SERVER)")
    parser.add_argument("--token", default=None, help="control-plane token (default $POLAR_TOKEN)")


def add_parser(subparsers: Any) -> None:
    """Add ``submit`` and ``status`` to the ``polar`` command."""
    submit = subparsers.add_parser("submit", help="submit TASK.yaml to a running rollout server")
    submit.add_argument("task", help="the task file (TASK.yaml)")
    _common(submit)
    submit.add_argument("--samples", type=int, default=None, help="override num_samples")
    submit.add_argument("--task-timeout", type=float, default=None, help="limit for the whole task, in seconds")
    submit.add_argument("--watch", action="store_true", help="print session results until the task finishes")
    submit.set_defaults(func=lambda a: _run(_submit(a)))
    status = subparsers.add_parser("status", help="show one task, or list recent tasks")
    status.add_argument("task_id", nargs="?", help="the task (default: list recent tasks)")
    _common(status)
    status.add_argument("--results", action="store_true", help="also list session results")
    status.add_argument("--json", action="store_true", help="print the raw response as JSON")
    status.add_argument("--limit", type=int, default=20, help="tasks to list")
    status.set_defaults(func=lambda a: _run(_status(a)))
