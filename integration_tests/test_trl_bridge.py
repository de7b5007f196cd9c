"""TRL's GRPOTrainer trained through Polar: a real run of two steps on the tiny model, on CPU.

The tiny fixture model (built locally, saved to a temporary directory) is both the trainer's policy and what the
embedded stack's proxy serves with its in-process transformers backend; the stack is the one ``polar train``
starts (rollout server, gateway with the sandboxed local runtime, proxy, reconstructor, evaluator). The agent is
the lowercase task's ``command`` harness (``examples/train/lowercase``: one chat completion with the ``openai``
SDK, rewarded by the share of a-z in the reply). ``GRPOTrainer`` gets ``polar_rollout_func`` as its
``rollout_func`` and ``polar_reward`` as its reward function; every step is one group of four sessions.

It asserts that the reward is logged at every step and is the mean of the sessions' rewards; that the rows the
trainer's loss sees carry the bridge's masks (``tool_mask``) and behaviour log-probabilities
(``sampling_per_token_logps``); and that the policy update reaches the proxy: after each step the bridge saves
the model and calls ``UpdatePolicy``, the calls of the next step are stamped with the new version, and the
log-probabilities the proxy recorded when sampling equal the trainer's own for the same tokens under the weights
it is training (and no longer the initial weights').
"""

from __future__ import annotations

import asyncio
import copy
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from polar_client import RolloutClient
from polar_core.model_fixtures import save_tiny_model
from polar_run.embedded import EmbeddedStack, StackOptions
from polar_train.bridges.trl import TrlBridgeSettings, polar_reward, polar_rollout_func
from polar_train.checkpoints import load_policy_model
from polar_train.tasks import load_template

trl = pytest.importorskip("trl")  # the TRL extra (requirements-trl.lock; scripts/setup.sh --all installs it)
torch = pytest.importorskip("torch")
datasets = pytest.importorskip("datasets")
pytest.importorskip("openai")

REPO = Path(__file__).resolve().parents[1]
TASK = REPO / "examples" / "train" / "lowercase" / "task.yaml"
STEPS = 2
GROUP = 4
PROMPTS = [
    "Reply in lowercase letters only.",
    "Write a few words in lowercase letters only.",
    "Say hello in lowercase.",
]
# The proxy and the trainer compute the same float32 log-softmax of the same weights on the same tokens, in
# different batch shapes; 1e-3 is far above that noise and far below what one optimiser step at lr 0.05 moves.
LOGPROB_TOLERANCE = 1e-3

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for the workspace"),
    # transformers 5.x renames gradient checkpointing; TRL 1.16 still calls the old names.
    pytest.mark.filterwarnings("ignore:.*is deprecated and will be removed in v6:FutureWarning"),
]


def _recording_trainer(base: Any, initial: Any) -> Any:
    """A GRPOTrainer that records what reaches its loss, with the trainer's and the initial model's logprobs."""

    class Recording(base):  # type: ignore[misc, valid-type]
        seen: list[dict[str, Any]]

        def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
            ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
            attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
            keep = inputs["completion_ids"].size(1)
            with torch.no_grad():
                current = self._get_per_token_logps_and_entropies(model, ids, attention, keep)[0]
                first = _token_logprobs(initial, ids, attention, keep)
            record = {k: inputs[k].detach().clone() for k in ("completion_ids", "completion_mask", "tool_mask")}
            record["behaviour"] = inputs["sampling_per_token_logps"].detach().clone()
            record.update(current=current, initial=first, step=int(self.state.global_step))
            self.seen.append(record)
            return super()._compute_loss(model, inputs)

    Recording.seen = []
    return Recording


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_grpo_trainer_trains_on_polar_rollouts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL; we know
    monkeypatch.setenv("TQDM_DISABLE", "1")
    torch.manual_seed(0)
    weights = save_tiny_model(tmp_path / "initial", seed=0)
    tokenizer, model = load_policy_model(weights)
    initial = copy.deepcopy(model)
    template = load_template(TASK, max_policy_lag=0, stale_policy="keep")
    prepared = template.prepared
    options = StackOptions(
        state_dir=tmp_path / "state",
        model=str(weights),
        backend=prepared.backend,
        backend_options=prepared.backend_options,
        harness_bin_dir=prepared.harness_bin_dir,
        running_workers=2,
        task_roots=(prepared.task_dir.absolute(),),
        read_only_roots=(prepared.task_dir.absolute(),),
    )
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        use_cpu=True,
        bf16=False,
        num_generations=GROUP,
        per_device_train_batch_size=GROUP,  # one group (one Polar task) per step
        max_steps=STEPS,
        learning_rate=0.05,
        beta=0.0,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        gradient_checkpointing=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    outputs: list[dict[str, Any]] = []
    started = time.monotonic()
    async with EmbeddedStack.start(options) as stack:
        print(f"stack started in {time.monotonic() - started:.1f} s")
        settings = TrlBridgeSettings(
            rollout_address=stack.rollout_address,
            token=stack.token,
            checkpoint_dir=tmp_path / "policy",
            task_timeout_s=300.0,
            run_id="trl-ci",
        )
        bridge = polar_rollout_func(settings, template, args=args, loop=asyncio.get_running_loop())

        def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
            started = time.monotonic()
            out = bridge(prompts, trainer)
            print(f"step {trainer.state.global_step}: {time.monotonic() - started:.1f} s, {out['polar_status']}")
            outputs.append(out)
            return out

        trainer_class = _recording_trainer(trl.GRPOTrainer, initial)
        trainer = trainer_class(
            model=model,
            reward_funcs=[polar_reward],
            args=args,
            train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS}),
            processing_class=tokenizer,
            rollout_func=rollout,
        )
        # TRL calls the rollout function synchronously from its training loop; the stack and the bridge's client
        # live on this event loop, so the training runs in a worker thread.
        print(f"trainer built at {time.monotonic() - started:.1f} s")
        await asyncio.to_thread(trainer.train)
        print(f"trained at {time.monotonic() - started:.1f} s")
        await asyncio.to_thread(bridge.sync_policy, trainer)  # the final weights too
        async with RolloutClient(stack.rollout_address, token=stack.token) as client:
            policy = await client.get_policy()
        await bridge.aclose()

    # The reward is logged at every step, and it is the mean of that step's Polar rewards.
    logs = [h for h in trainer.state.log_history if "reward" in h]
    assert [h["step"] for h in logs] == list(range(1, STEPS + 1)), trainer.state.log_history
    assert len(outputs) == STEPS
    for log, out in zip(logs, outputs, strict=True):
        assert log["reward"] == pytest.approx(statistics.fmean(out["polar_reward"]), abs=1e-5)
        assert log["rewards/polar_reward/mean"] == pytest.approx(log["reward"])
        assert log["polar/policy_version"] == out["polar_policy_version"]
    assert sum(out["polar_failed_sessions"] for out in outputs) <= 1, [o["polar_status"] for o in outputs]
    assert bridge.stats.refused_traces == 0
    assert bridge.stats.sessions == STEPS * GROUP

    # The bridge's masks and behaviour logprobs are what the trainer's loss saw (row order may be shuffled).
    seen = trainer_class.seen
    assert [r["step"] for r in seen] == list(range(STEPS))
    for record, out in zip(seen, outputs, strict=True):
        assert _rows(record) == _expected_rows(out)

    # The policy update reached the proxy: step k was sampled under version k, the fleet ends at STEPS, and
    # the proxy's behaviour logprobs are the trainer's own under the weights being trained.
    assert [out["polar_policy_version"] for out in outputs] == list(range(STEPS))
    for k, out in enumerate(outputs):
        assert {v for v in out["polar_sampled_version"] if v >= 0} == {k}  # -1: a failed session's placeholder
    assert bridge.stats.policy_updates == STEPS
    assert policy.policy.version == STEPS
    assert policy.proxies
    assert all(p.version == STEPS and not p.paused and not p.error for p in policy.proxies), policy
    assert (settings.checkpoint_dir / f"v{STEPS}" / "config.json").is_file()
    for record in seen:
        mask = (record["completion_mask"] * record["tool_mask"]).bool()
        assert mask.any()
        gap = (record["behaviour"] - record["current"]).abs()[mask].max().item()
        moved = (record["behaviour"] - record["initial"]).abs()[mask].max().item()
        print(f"step {record['step']}: |behaviour - trainer| <= {gap:.2e}, |behaviour - initial| <= {moved:.2e}")
        assert gap < LOGPROB_TOLERANCE, (record["step"], gap)
        if record["step"] > 0:  # the weights moved, and the proxy sampled from the moved weights
            assert moved > 10 * LOGPROB_TOLERANCE, (record["step"], moved)


def _token_logprobs(model: Any, ids: Any, attention: Any, keep: int) -> Any:
    """Log-probabilities of the last ``keep`` tokens (at temperature 1) under ``model`` (not patched by TRL)."""
    logits = model(input_ids=ids, attention_mask=attention).logits[:, -keep - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, -keep:].unsqueeze(-1)).squeeze(-1)


def _rows(record: dict[str, Any]) -> list[tuple[tuple[int, ...], tuple[int, ...], tuple[float, ...]]]:
    rows = []
    for i in range(record["completion_ids"].size(0)):
        n = int(record["completion_mask"][i].sum())
        ids = tuple(int(x) for x in record["completion_ids"][i, :n])
        mask = tuple(int(x) for x in record["tool_mask"][i, :n])
        logprobs = tuple(round(float(x), 4) for x in record["behaviour"][i, :n])
        rows.append((ids, mask, logprobs))
    return sorted(rows)


def _expected_rows(out: dict[str, Any]) -> list[tuple[tuple[int, ...], tuple[int, ...], tuple[float, ...]]]:
    return sorted(
        (tuple(ids), tuple(mask), tuple(round(float(x), 4) for x in logprobs))
        for ids, mask, logprobs in zip(out["completion_ids"], out["env_mask"], out["logprobs"], strict=True)
    )
