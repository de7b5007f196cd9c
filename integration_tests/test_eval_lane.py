"""The evaluation lane through the real stack: rounds pinned to a version, checked against the recorded calls.

* The lane on the embedded stack (rollout server, gateway with the sandboxed local runtime, proxy with the
  scripted backend, reconstructor, evaluator) and the lowercase task's ``command`` agent (the openai SDK) and
  evaluator: a round pinned to the version the fleet serves counts every session with the evaluator's reward;
  after a real ``UpdatePolicy`` a round still pinned to the old version counts none of them (each is reported
  as mismatched, with the version its call carried), and a round at the new version counts them all again.
* ``run_training`` with ``eval_every`` on the tiny model (in-process transformers backend, real updates): every
  round is in ``eval.jsonl`` at the version served after its update, every counted session was sampled at its
  round's version, and no eval session reached a training batch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("openai")

from polar_client import EvalLane, EvalTask, RolloutClient
from polar_core.model_fixtures import save_tiny_model
from polar_run.embedded import EmbeddedStack, StackOptions
from polar_train.tasks import load_template

REPO = Path(__file__).resolve().parents[1]
TASK = REPO / "examples" / "train" / "lowercase" / "task.yaml"
REPLY = "hello world"  # the scripted model's reply to every session: 10 lowercase letters of 48


@pytest.mark.timeout(600)
async def test_a_round_counts_only_sessions_sampled_at_its_pinned_version(tmp_path: Path) -> None:
    os.environ.setdefault("TQDM_DISABLE", "1")
    template = load_template(TASK, max_policy_lag=0, stale_policy="keep")
    prepared = template.prepared
    options = StackOptions(
        state_dir=tmp_path / "state",
        model=str(save_tiny_model(tmp_path / "v0", seed=0)),
        backend="scripted",
        backend_options={"turns": [{"text": REPLY}]},
        harness_bin_dir=prepared.harness_bin_dir,
        running_workers=2,
        task_roots=(prepared.task_dir,),
        read_only_roots=(prepared.task_dir,),
    )
    held_out = EvalTask(template.task("colour", group_size=1, instruction="Name a colour in lowercase."), 2)
    async with EmbeddedStack.start(options) as stack, RolloutClient(stack.rollout_address, token=stack.token) as client:
        lane = EvalLane(client, [held_out], task_id_prefix="it", report_path=tmp_path / "eval.jsonl")
        at_v0 = await lane.start_round(0)
        (tmp_path / "v1").mkdir()  # the scripted backend takes any directory and changes only the version
        assert (await client.update_policy(1, tmp_path / "v1")).complete
        stale = await lane.run_round(0)  # pinned to v0 while the fleet serves v1
        at_v1 = await lane.run_round(1)

    assert (at_v0.sessions, at_v0.mismatched_sessions) == (2, 0)
    assert at_v0.mean_reward == pytest.approx(10 / 48, abs=1e-6)  # the evaluator's reward of the scripted reply
    assert (stale.sessions, stale.sessions_total, stale.mismatched_sessions) == (0, 2, 2)
    assert [m["policy_versions"] for m in stale.mismatched] == [["1"], ["1"]]
    assert stale.mean_reward == 0.0
    assert not stale.complete
    assert (at_v1.sessions, at_v1.mismatched_sessions, at_v1.policy_version) == (2, 0, 1)
    reports = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert [(r["round"], r["policy_version"], r["sessions"], r["mismatched_sessions"]) for r in reports] == [
        (0, 0, 2, 0),
        (1, 0, 0, 2),
        (2, 1, 2, 0),
    ]


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_polar_train_runs_rounds_beside_training_through_the_stack(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from polar_train import SessionSample, TrainConfig, run_training

    os.environ.setdefault("TQDM_DISABLE", "1")
    config = TrainConfig(
        model=str(save_tiny_model(tmp_path / "initial", seed=0)),
        task=TASK,
        run_dir=tmp_path / "run",
        group_size=2,
        groups_per_step=1,
        steps=2,
        learning_rate=0.05,
        max_policy_lag=1,
        submit_next="before_update",
        eval_every=1,
        eval_tasks=({"instruction": "Name a colour in lowercase letters only.", "samples": 2, "name": "colour"},),  # type: ignore[arg-type]
        workers=2,
    )
    trained: list[SessionSample] = []
    rows = await run_training(config, on_sessions=lambda _step, s: trained.extend(s))

    assert [r.version for r in rows] == [0, 1]
    assert trained
    assert not any("-eval-" in s.task_id for s in trained)
    reports = [json.loads(line) for line in (config.run_dir / "eval.jsonl").read_text().splitlines()]
    assert sorted((r["round"], r["policy_version"], r["step"]) for r in reports) == [(0, 0, None), (1, 1, 0), (2, 2, 1)]
    for report in reports:
        assert report["sessions_total"] == 2
        assert report["sessions"] + report["mismatched_sessions"] == 2
    sessions = [json.loads(line) for line in (config.run_dir / "eval_sessions.jsonl").read_text().splitlines()]
    assert len(sessions) == 6
    for session in sessions:
        sampled = {int(v) for v in session["policy_versions"]}
        assert session["matched"] == (sampled <= {session["policy_version"]})
