"""Polar's trainer client: submit tasks to a rollout server, watch session results, pad traces into tensors.

Example::

    from polar_client import RolloutClient, traces_to_tensors

    async with RolloutClient("rollout:50051", token=TOKEN) as client:
        reply = await client.submit("TASK.yaml")
        traces = [t async for r in client.watch(reply.task_id) for t in r.traces]
        # ... train, save a checkpoint, then move the whole fleet (update.failed names any proxy that did not load it):
        update = await client.update_policy(1, "/ckpt/v1")
    batch = traces_to_tensors(traces, pad_token_id=0)
"""

from __future__ import annotations

from polar_client.client import RolloutClient, TaskLike
from polar_client.evaluation import EvalLane, EvalRoundReport, EvalTask
from polar_client.policy import PolicyUpdateResult, ProxyUpdateResult
from polar_client.settings import ClientSettings
from polar_client.taskfile import load_task, task_from_mapping
from polar_client.tensors import as_trace, traces_to_tensors

__all__ = [
    "ClientSettings",
    "EvalLane",
    "EvalRoundReport",
    "EvalTask",
    "PolicyUpdateResult",
    "ProxyUpdateResult",
    "RolloutClient",
    "TaskLike",
    "as_trace",
    "load_task",
    "task_from_mapping",
    "traces_to_tensors",
]
