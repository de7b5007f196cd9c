"""The fleet's stored policy survives restarts: ``polar serve`` registers its proxy, and a restart serves what
an earlier run stored.

* ``polar serve`` (all five services, one process, the tiny model on the in-process transformers backend): the
  rollout server's ``GetPolicy`` lists the proxy, ``UpdatePolicy`` to a real tiny checkpoint moves it, and the same
  command restarted on the same state directory has its proxy serve that version again (it joins the fleet and
  loads the stored checkpoint before its first call).
* The embedded stack of ``polar run``/``polar generate``/``polar train``, started twice on one state directory:
  the second start serves the version the first stored, and one whose stored checkpoint is gone refuses to start.
* ``polar train`` run twice on one run directory (``--resume`` the second time): the second run starts from the
  stored version and its checkpoint, and its updates continue the version numbers.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from polar.rollout.v1 import rollout_service_pb2 as pb

from polar_client import RolloutClient
from polar_core.errors import FailedPrecondition
from polar_core.model_fixtures import save_tiny_model
from polar_run.embedded import EmbeddedStack, StackOptions
from polar_run.serve import SERVE_PROXY_ID

REPO = Path(__file__).resolve().parents[1]
POLAR = [sys.executable, "-m", "polar_run"]


class _Serve:
    """One ``polar serve`` process; its services' addresses and token read from what it prints."""

    def __init__(self, proc: asyncio.subprocess.Process, lines: list[str]) -> None:
        self.proc = proc
        self.lines = lines

    @classmethod
    async def start(cls, state_dir: Path) -> _Serve:
        env = {**os.environ, "POLAR_PROXY_MODEL": "tiny", "TQDM_DISABLE": "1"}
        proc = await asyncio.create_subprocess_exec(
            *POLAR, "serve", "--state-dir", str(state_dir),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=env, cwd=REPO,
        )  # fmt: skip
        assert proc.stdout is not None
        lines: list[str] = []
        while not any(line.startswith("control-plane token:") for line in lines):
            raw = await asyncio.wait_for(proc.stdout.readline(), timeout=240)
            if not raw:
                raise AssertionError(f"polar serve exited ({await proc.wait()}) after printing {lines}")
            lines.append(raw.decode().strip())
        return cls(proc, lines)

    def address(self, name: str) -> str:
        line = next(line for line in self.lines if line.split()[0] == name and "(" in line)
        return line.split()[1]

    @property
    def token(self) -> str:
        return next(line for line in self.lines if line.startswith("control-plane token:")).split(": ", 1)[1]

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(self.proc.wait(), timeout=60)


async def _proxy_serving(client: RolloutClient, version: int) -> list[pb.ProxyInfo]:
    """GetPolicy's proxies once one serves ``version`` unpaused (a restarted proxy joins in the background)."""
    for _ in range(600):
        reply = await client.get_policy()
        if any(p.version == version and not p.paused for p in reply.proxies):
            return list(reply.proxies)
        await asyncio.sleep(0.2)
    raise AssertionError(f"no proxy serves v{version}: {reply}")


@pytest.mark.timeout(600)
async def test_polar_serve_registers_its_proxy_and_serves_the_stored_policy_after_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "state"
    checkpoint = save_tiny_model(tmp_path / "v1", seed=1)
    serve = await _Serve.start(state)
    try:
        async with RolloutClient(serve.address("rollout"), token=serve.token) as client:
            proxies = await _proxy_serving(client, 0)
            assert [(p.proxy_id, p.address) for p in proxies] == [(SERVE_PROXY_ID, serve.address("proxy"))]
            update = await client.update_policy(1, checkpoint)
            assert update.complete, update
            reply = await client.get_policy()
            assert reply.policy.version == 1
            assert [(p.proxy_id, p.version, p.paused) for p in reply.proxies] == [(SERVE_PROXY_ID, 1, False)]
    finally:
        await serve.stop()

    again = await _Serve.start(state)
    try:
        async with RolloutClient(again.address("rollout"), token=again.token) as client:
            proxies = await _proxy_serving(client, 1)
            # One record, refreshed at the new address: no unreachable proxy left behind to fail the next update.
            assert [(p.proxy_id, p.address) for p in proxies] == [(SERVE_PROXY_ID, again.address("proxy"))]
            reply = await client.get_policy()
            assert (reply.policy.version, reply.policy.weights_path) == (1, str(checkpoint))
            update = await client.update_policy(2, save_tiny_model(tmp_path / "v2", seed=2))
            assert update.complete, update
    finally:
        await again.stop()


@pytest.mark.timeout(600)
async def test_the_embedded_stack_restarted_on_its_state_directory_serves_the_stored_policy(tmp_path: Path) -> None:
    initial = save_tiny_model(tmp_path / "v0", seed=0)
    checkpoint = save_tiny_model(tmp_path / "v1", seed=1)
    options = StackOptions(
        state_dir=tmp_path / "state", model=str(initial), backend="transformers", task_roots=(tmp_path,)
    )
    async with EmbeddedStack.start(options) as stack, RolloutClient(stack.rollout_address, token=stack.token) as client:
        assert (await client.get_policy()).proxies[0].version == 0
        assert (await client.update_policy(1, checkpoint)).complete

    async with EmbeddedStack.start(options) as stack, RolloutClient(stack.rollout_address, token=stack.token) as client:
        reply = await client.get_policy()
        assert reply.policy.version == 1
        assert [(p.version, p.paused) for p in reply.proxies] == [(1, False)]

    shutil.rmtree(checkpoint)
    with pytest.raises(FailedPrecondition, match=r"policy v1 .* cannot be loaded"):
        async with EmbeddedStack.start(options):
            pass


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_polar_train_twice_on_one_run_directory_continues_from_the_stored_policy(tmp_path: Path) -> None:
    config = tmp_path / "train.yaml"
    config.write_text(
        json.dumps(
            {
                "model": "tiny",
                "task": str(REPO / "examples" / "train" / "lowercase" / "task.yaml"),
                "run_dir": str(tmp_path / "run"),
                "group_size": 2,
                "groups_per_step": 1,
                "steps": 1,
                "learning_rate": 0.05,
                "submit_next": "after_update",
                "max_policy_lag": 0,
                "workers": 2,
            }
        ),
        encoding="utf-8",
    )
    env = {**os.environ, "TQDM_DISABLE": "1"}
    for extra in ([], ["--resume", "--steps", "2"]):
        proc = await asyncio.create_subprocess_exec(
            *POLAR, "train", str(config), *extra,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, cwd=tmp_path,
        )  # fmt: skip
        out, err = await proc.communicate()
        assert proc.returncode == 0, (out.decode(), err.decode()[-4000:])

    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # Step 0 trained v0 and stored v1; the resumed run's step 1 sampled and trained v1 (the proxy reloaded it).
    assert [(r["step"], r["version"]) for r in rows] == [(0, 0), (1, 1)]
    assert rows[1]["sampled_versions"] == [1]
    assert (tmp_path / "run" / "checkpoints" / "v2" / "config.json").is_file()
