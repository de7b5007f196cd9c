"""The CI proof of the policy loop: the reference GRPO trainer raises the tiny model's reward through the stack.

The tiny fixture model (saved to a temporary directory as the initial checkpoint) is served by the proxy's
in-process transformers backend of the embedded stack (rollout server, gateway with the sandboxed local
runtime, proxy, reconstructor, evaluator: the wiring ``polar run`` uses). The agent is a ``command``-harness
program that asks the proxy for one chat completion with the official ``openai`` SDK and writes the reply to a
file; the task's ``command`` evaluator scores it with the shaped reward "share of a-z among the first 48
characters" (examples/train/lowercase). Six steps of two groups of eight, six policy updates. The trainer
submits step k+1 right after its optimiser step, while the checkpoint is saved and the fleet updated
(``submit_next: before_update``), so a session that reaches the model before the update is trained one version
behind (``max_policy_lag`` 1). Not ``before_step``: the research prototype showed that when every token is a
version stale, this tiny model at this learning rate learns too unreliably to assert a reward (docs/training.md).

Every update is the real thing: ``UpdatePolicy`` on the rollout server, which checks the checkpoint on the proxy,
pauses it, has its transformers backend load the checkpoint, sets the version and resumes.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("openai")

from model_proxy.core.parsing import HermesParser
from polar_core.model_fixtures import save_tiny_model
from polar_train import SessionSample, TrainConfig, format_table, read_metrics, run_training
from polar_train.metrics import first_and_last

REPO = Path(__file__).resolve().parents[1]
TASK = REPO / "examples" / "train" / "lowercase" / "task.yaml"
STEPS = 6
AVERAGED = 2
# The margin the last two steps' mean reward must beat the first two steps' by, from the run-to-run spread the
# research prototype of this loop measured (/work/notes/grpo.md, summarised in docs/training.md "The CI proof"):
# with learning rate 0 (the same sampling, no learning) the last-two minus first-two difference has mean
# +0.011, sd 0.021 and maximum +0.042 over 12 seeds; with these settings (lr 0.05) it has mean +0.246, sd
# 0.054 and minimum +0.131 over 18 runs. 0.08 is 3.3 null standard deviations above the null mean (about twice
# the largest null rise seen) and 1.6 times below the smallest rise seen with learning.
MARGIN = 0.08
FINAL_REWARD = 0.75  # the last two steps' mean: the 18 prototype runs all ended above 0.81


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_grpo_through_the_stack_raises_the_reward_within_the_lag_bound(tmp_path: Path) -> None:
    os.environ.setdefault("TQDM_DISABLE", "1")
    weights = save_tiny_model(tmp_path / "initial", seed=0)
    config = TrainConfig(
        model=str(weights),
        task=TASK,
        run_dir=tmp_path / "run",
        group_size=8,
        groups_per_step=2,
        steps=STEPS,
        learning_rate=0.05,
        tis_cap=2.0,
        max_policy_lag=1,
        submit_next="before_update",
        instructions=("Reply in lowercase letters only.", "Write a few words in lowercase letters only."),
        seed=0,
        workers=2,
        task_timeout_s=600.0,
    )
    sessions: list[SessionSample] = []
    rows = await run_training(config, on_sessions=lambda _step, s: sessions.extend(s))

    print(format_table([r.to_dict() for r in rows]))  # in the CI log with -s: the curve this run drew
    assert len(rows) == STEPS
    # Six policy updates through UpdatePolicy, in order, each from its own checkpoint.
    assert [r.version for r in rows] == list(range(STEPS))
    for version in range(1, STEPS + 1):
        assert (config.run_dir / "checkpoints" / f"v{version}" / "config.json").is_file()
    # The versions recorded on the calls increase across steps: step k trains on what v(k-1) or v(k) sampled.
    for row in rows:
        assert row.sampled_versions, row
        assert min(row.sampled_versions) >= row.version - config.max_policy_lag
        assert max(row.sampled_versions) <= row.version
    assert [max(r.sampled_versions) for r in rows] == sorted(max(r.sampled_versions) for r in rows)
    assert max(rows[-1].sampled_versions) > max(rows[0].sampled_versions)
    # No trainable token beyond the lag bound reached the loss (build_batch drops and counts them, and
    # train_on_batch raises LagBoundViolated if one gets through).
    assert all(r.max_trained_lag <= config.max_policy_lag for r in rows)
    assert all(r.trainable_tokens > 0 for r in rows)
    assert sum(r.sessions.get("infra_error", 0) for r in rows) <= 2, [r.sessions for r in rows]
    # The reward rises by more than the run-to-run spread allows by chance.
    first, last = first_and_last([r.to_dict() for r in rows], AVERAGED)
    assert last - first >= MARGIN, [round(r.reward_mean, 3) for r in rows]
    assert last >= FINAL_REWARD, [round(r.reward_mean, 3) for r in rows]
    # The reward is the reply's, untouched by the harness: recomputed from each trace's sampled tokens through
    # the proxy's own output parser, it equals what the evaluator gave.
    _check_rewards(weights, sessions)
    # The run directory.
    assert [r["step"] for r in read_metrics(config.run_dir / "metrics.jsonl")] == list(range(STEPS))
    assert (config.run_dir / "reward_curve.png").read_bytes()[:4] == b"\x89PNG"


def _check_rewards(weights: Path, sessions: list[SessionSample]) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(weights)
    spec = importlib.util.spec_from_file_location("lowercase_reward", TASK.parent / "reward.py")
    assert spec is not None
    assert spec.loader is not None
    reward: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reward)
    checked = 0
    for session in sessions:
        if session.status == "infra_error":
            continue
        (trace,) = session.traces  # one call per session: one trace
        stream = HermesParser().stream(lambda i: f"call_{i}")
        stream.feed(str(tokenizer.decode(trace.response_token_ids, skip_special_tokens=True)))
        stream.finish()
        assert reward.lowercase_prefix(stream.result().text) == pytest.approx(session.reward, abs=1e-9)
        checked += 1
    assert checked >= len(sessions) - 2
