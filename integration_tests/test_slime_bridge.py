"""The slime bridge through the real Polar stack: slime's rollout function gets Samples, and a restart replays.

The embedded stack runs the real rollout server, gateway (sandboxed local runtime), model proxy (tiny tokenizer,
scripted backend), reconstructor and evaluator over gRPC. Each session is a ``command``-harness agent that makes
one chat call with the OpenAI SDK. slime itself is not installed: the test calls
``polar_train.bridges.slime.generate_rollout`` as slime's rollout manager does (synchronously, with an args
namespace and a data source), with the stand-in of slime's ``Sample`` (polar_train/bridges/tests), then stops
the bridge as a killed process would stop, restarts it from an earlier data-source checkpoint and checks that the
recorded rollout comes back identical and that no group was submitted as a new task twice.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from polar_client import RolloutClient
from polar_run.embedded import EmbeddedStack, StackOptions
from polar_train.bridges import slime
from polar_train.bridges.tests.slime_sample_standin import Sample, StandInDataSource, check_train_contract

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for the workspace"),
]
pytest.importorskip("openai")

AGENT = """
import os
from openai import OpenAI
client = OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"], max_retries=2,
                timeout=120)
reply = client.chat.completions.create(model=os.environ["POLAR_MODEL"], max_tokens=32,
                                       messages=[{"role": "user", "content": os.environ["POLAR_INSTRUCTION"]}])
open("reply.txt", "w").write(reply.choices[0].message.content or "")
"""
BATCH, SAMPLES, LEVEL = 1, 2, 2


def _task_file(tmp_path: Path) -> Path:
    task = tmp_path / "task.yaml"  # the agent runs inline: the sandbox's user cannot read the test's tmp_path
    template = {
        "instruction": "replaced by each prompt",
        "timeout_seconds": 300,
        "harness": {"name": "command", "argv": [sys.executable, "-c", AGENT]},
        "runtime": {"kind": "local"},
        "evaluator": {"strategy": "session_completed"},
    }
    task.write_text(yaml.safe_dump(template))
    return task


def _args(tmp_path: Path, stack: EmbeddedStack) -> argparse.Namespace:
    # What slime's parser gives, with the bridge's keys as --custom-config-path would set them.
    return argparse.Namespace(
        rollout_batch_size=BATCH,
        n_samples_per_prompt=SAMPLES,
        save=str(tmp_path / "ckpt"),
        polar_server=stack.rollout_address,
        polar_token=stack.token,
        polar_task=str(_task_file(tmp_path)),
        polar_max_async_level=LEVEL,
        polar_max_policy_lag=LEVEL,
        polar_sample_type="polar_train.bridges.tests.slime_sample_standin:Sample",
    )


async def _rollout(args: argparse.Namespace, rollout_id: int, source: StandInDataSource) -> list[list[Any]]:
    # slime's rollout manager calls the function synchronously; the stack serves on this test's loop meanwhile.
    return await asyncio.to_thread(slime.generate_rollout, args, rollout_id, source)


def _check(groups: list[list[Any]]) -> None:
    for sample in check_train_contract(groups, rollout_batch_size=BATCH, n_samples_per_prompt=SAMPLES):
        assert sample.status is Sample.Status.COMPLETED, sample.metadata
        assert sample.metadata["polar_status"] == "resolved"
        assert sample.reward == 1.0
        assert sample.loss_mask is not None
        assert sample.rollout_log_probs is not None
        assert sum(sample.loss_mask) == sample.response_length  # one call: every response token was sampled
        assert all(lp <= 0.0 for lp in sample.rollout_log_probs)
        assert sample.metadata["policy_version"] == 0
        assert sample.weight_versions
        assert sample.metadata["polar_task_id"].endswith(f"-g{sample.metadata['group_id']:08d}")


@pytest.mark.timeout(600)
async def test_slime_rollouts_through_the_stack_and_a_restart_replays(tmp_path: Path) -> None:
    script = tmp_path / "script.jsonl"
    script.write_text('{"text": "all lowercase words"}\n')
    options = StackOptions(
        state_dir=tmp_path / "state",
        model="tiny",
        backend="scripted",
        backend_options={"script": str(script)},
        context_length=2048,
        running_workers=4,
        init_workers=2,
        postrun_workers=2,
        max_attempts=1,
    )
    prompts = [f"Write prompt number {i} in lowercase." for i in range(20)]
    async with EmbeddedStack.start(options) as stack:
        args = _args(tmp_path, stack)
        source = StandInDataSource(prompts, SAMPLES)
        try:
            first = [await _rollout(args, 0, source)]
            checkpoint = source.save()
            first.append(await _rollout(args, 1, source))
            for groups in first:
                _check(groups)
            assert [g[0].prompt for groups in first for g in groups] == prompts[:2]
            bridge = slime.running_bridge(tmp_path / "ckpt" / "polar_slime_journal.jsonl")
            assert bridge is not None
            assert bridge.in_flight == BATCH * LEVEL
            assert bridge.counters.refused_traces == 0

            slime.close_bridges()  # the process dies; slime restarts from the checkpoint of rollout 0
            source.load(checkpoint)
            replayed = await _rollout(args, 1, source)
            assert [[s.to_dict() for s in g] for g in replayed] == [[s.to_dict() for s in g] for g in first[1]]
            after = await _rollout(args, 2, source)
            _check(after)
            assert [g[0].prompt for g in after] == prompts[2:3]
        finally:
            slime.close_bridges()
        async with RolloutClient(stack.rollout_address, token=stack.token) as client:
            tasks = list((await client.list(page_size=100)).tasks)
            instructions = [t.task.instruction for t in tasks]
            assert len(instructions) == len(set(instructions)) == 3 + BATCH * LEVEL  # each group sampled once
            for task in tasks:  # the bridge leaves its window sampling; let it finish before the stack stops
                await client.wait(task.task.task_id, poll_s=0.5)
