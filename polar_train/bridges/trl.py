"""TRL's ``GRPOTrainer`` fed by Polar: a ``rollout_func`` that samples each group as one Polar task.

Written against ``trl==1.16.0`` (``requirements-trl.lock``), whose ``GRPOTrainer(rollout_func=...)`` calls
``rollout_func(prompts, trainer)`` once per generation batch, from its training thread, with every prompt
repeated ``num_generations`` times in a row, and wants back one row per prompt: ``prompt_ids``,
``completion_ids`` and ``logprobs``, optionally ``env_mask`` (its loss mask of model-written tokens); every
other key reaches the reward functions as a keyword argument (a list: one value per row; a scalar: the same for
every row). Example::

    from polar_train.bridges.trl import TrlBridgeSettings, polar_reward, polar_rollout_func
    from polar_train.tasks import load_template

    args = GRPOConfig(output_dir="out", num_generations=8, per_device_train_batch_size=8, logging_steps=1)
    template = load_template(Path("task.yaml"), max_policy_lag=0, stale_policy="keep")
    rollout = polar_rollout_func(TrlBridgeSettings(rollout_address="rollout:50051", checkpoint_dir=Path("ckpt")),
                                 template, args=args)
    trainer = GRPOTrainer(model=model, reward_funcs=[polar_reward], args=args, train_dataset=dataset,
                          processing_class=tokenizer, rollout_func=rollout)
    trainer.train()
    rollout.sync_policy(trainer)  # the fleet ends on the final weights
    rollout.close()

One call of the rollout function:

1. If the trainer stepped since the last call, move the fleet to its weights: save ``trainer.model`` and the
   tokenizer to ``checkpoint_dir/v{N}`` and call ``UpdatePolicy(N)`` (N counts up from the fleet's version at the
   first call), so every session of this batch samples from the weights being trained. TRL's own vLLM sync
   happens at the same point, for the same reason.
2. Each run of ``num_generations`` equal prompts is one Polar task with ``num_samples = num_generations`` and the
   prompt as its instruction (the last user message of a conversational prompt).
3. The tasks are submitted together and watched (``WatchTask``) until terminal or ``task_timeout_s``.
4. Each task's results become ``num_generations`` rows (:func:`~polar_train.bridges.trl_rows.group_rows`: one
   trace per session, failed sessions masked, inconsistent traces refused and counted); the rewards travel
   under ``polar_reward`` to :func:`polar_reward`, the reward function to pass to the trainer.

The gRPC client lives on an asyncio event loop: the bridge starts its own in a thread, or uses ``loop`` (a
process that serves the Polar stack itself, like the integration test, passes its loop and runs
``trainer.train()`` in a worker thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shutil
import threading
import uuid
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import grpc
from polar.common.v1 import session_pb2, task_pb2
from pydantic import BaseModel, ConfigDict, Field

from polar_client import RolloutClient
from polar_core.errors import FailedPrecondition, InvalidArgument
from polar_train.bridges.trl_rows import Completion, GroupRows, MultiTrace, group_rows
from polar_train.checkpoints import save_checkpoint

__all__ = [
    "REWARD_KEY",
    "TRL_VERSION",
    "BridgeStats",
    "PolarRollout",
    "TaskTemplate",
    "TrlBridgeSettings",
    "polar_reward",
    "polar_rollout_func",
]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

TRL_VERSION = "1.16.0"  # the release this bridge is written and tested against (requirements-trl.lock)
REWARD_KEY = "polar_reward"  # the extra key that carries each row's reward to polar_reward


class TrlBridgeSettings(BaseModel):
    """How the bridge reaches the fleet and what it does with what comes back.

    Attributes:
        rollout_address: The rollout server (``host:port``).
        token: Its control-plane token.
        checkpoint_dir: Where each new policy is saved (``v{N}`` below it) for the proxies to load: a path
            every proxy can read.
        task_timeout_s: Deadline of each task on the rollout server; the bridge stops watching a task a minute
            later, cancels it and fails the sessions it did not get.
        rpc_timeout_s: Deadline of each unary call (``UpdatePolicy`` waits for the whole update).
        pause_mode: ``UpdatePolicy``'s pause mode (``drain`` or ``abort``).
        multi_trace: Which trace a session reconstructed into several contributes: ``last`` or ``longest``
            (``polar_train/bridges/trl_rows.py``).
        failed_reward: Reward of a failed session's row (its mask is all 0); ``None`` makes TRL leave the row
            out of its group's mean and standard deviation.
        keep_checkpoints: Policy checkpoints kept in ``checkpoint_dir`` (older ones this bridge wrote are
            removed once the fleet has moved past them).
        run_id: Prefix of every task id (the command agent of ``examples/train`` seeds its sampling from its
            session id, which carries it); empty: a random one. Task ids must be new on the server.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    rollout_address: str = Field(min_length=1)
    token: str = ""
    checkpoint_dir: Path
    task_timeout_s: float = Field(default=600.0, gt=0)
    rpc_timeout_s: float = Field(default=60.0, gt=0)
    pause_mode: Literal["drain", "abort"] = "drain"
    multi_trace: MultiTrace = "last"
    failed_reward: float | None = 0.0
    keep_checkpoints: int = Field(default=2, ge=1)
    run_id: str = ""


class TaskTemplate(Protocol):
    """Stamps one group's task (``polar_train.tasks.GroupTemplate`` is one)."""

    def task(self, task_id: str, *, group_size: int, instruction: str | None = None) -> task_pb2.Task:
        """The task of one group: ``group_size`` samples of ``instruction``."""
        ...


class _Client(Protocol):
    """What the bridge calls on the rollout server (:class:`polar_client.RolloutClient`)."""

    async def submit(self, task: task_pb2.Task, *, task_timeout_s: float | None = None) -> Any: ...

    def watch(self, task_id: str) -> Any: ...

    async def cancel(self, task_id: str, reason: str = "") -> Any: ...

    async def get_policy(self) -> Any: ...

    async def update_policy(self, version: int, weights_path: str | Path, *, pause_mode: Any = "drain") -> Any: ...

    async def close(self) -> None: ...


@dataclasses.dataclass(slots=True)
class BridgeStats:
    """Running counts over the bridge's life (each batch's also reach TRL's logs through :func:`polar_reward`).

    Attributes:
        calls: Rollout calls (generation batches).
        groups: Tasks submitted.
        sessions: Rows returned.
        failed_sessions: Rows that are masked placeholders (failed, missing or refused sessions).
        refused_traces: Traces refused because their mask or logprobs differ in length from their tokens.
        extra_traces: Traces of multi-trace sessions not returned (see ``multi_trace``).
        policy_updates: ``UpdatePolicy`` calls that moved the fleet.
        version: The fleet's policy version the last batch was sampled under (-1 before the first call).
    """

    calls: int = 0
    groups: int = 0
    sessions: int = 0
    failed_sessions: int = 0
    refused_traces: int = 0
    extra_traces: int = 0
    policy_updates: int = 0
    version: int = -1


class _Loop:
    """An event loop to run the client's coroutines on: its own, in a daemon thread, or one given."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self._thread: threading.Thread | None = None
        if loop is None:
            loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=loop.run_forever, name="polar-trl-bridge", daemon=True)
            self._thread.start()
        self.loop = loop

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:  # waiting here for the loop would block it forever
            coro.close()
            raise FailedPrecondition(
                "the TRL bridge was called on the event loop it runs its client on: run trainer.train() in "
                "another thread (asyncio.to_thread)"
            )
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        if self._thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
            self.loop.close()
            self._thread = None


def _instruction(prompt: Any) -> str:
    """A TRL prompt as a Polar instruction: the text, or the last user message of a conversation."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Sequence):
        for message in reversed(prompt):
            if isinstance(message, dict) and message.get("role") == "user":
                content = message.get("content")
                if isinstance(content, str):
                    return content
                if isinstance(content, list):
                    return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    raise InvalidArgument(f"cannot make a Polar instruction of the prompt {prompt!r}; pass instruction_of")


def _groups(prompts: Sequence[Any], group_size: int) -> list[Any]:
    """One prompt per group: TRL repeats each prompt ``group_size`` times in a row."""
    if group_size < 2:
        raise InvalidArgument(f"num_generations is {group_size}: a group of size 1 has no relative advantage")
    if not prompts or len(prompts) % group_size:
        raise InvalidArgument(f"{len(prompts)} prompts do not form groups of {group_size} (num_generations)")
    heads = []
    for start in range(0, len(prompts), group_size):
        group = prompts[start : start + group_size]
        if any(p != group[0] for p in group):
            raise InvalidArgument(
                f"prompts {start}..{start + group_size - 1} are not one prompt repeated num_generations times: "
                f"this TRL release passes prompts differently than trl=={TRL_VERSION}"
            )
        heads.append(group[0])
    return heads


class PolarRollout:
    """TRL's ``rollout_func`` over a Polar fleet (see the module docstring); build it with
    :func:`polar_rollout_func`, which checks the configuration first.

    Args:
        settings: The bridge's settings.
        template: Stamps each group's task.
        instruction_of: Turns a TRL prompt into the task's instruction (default: the text, or the last user
            message).
        loop: The event loop to run the client on (default: the bridge's own, in a thread).
        client_factory: Builds the client, called on that loop (default: :class:`polar_client.RolloutClient`).
    """

    def __init__(
        self,
        settings: TrlBridgeSettings,
        template: TaskTemplate,
        *,
        instruction_of: Callable[[Any], str] = _instruction,
        loop: asyncio.AbstractEventLoop | None = None,
        client_factory: Callable[[], _Client] | None = None,
    ) -> None:
        self.settings = settings
        self.stats = BridgeStats()
        self._template = template
        self._instruction_of = instruction_of
        self._run_id = settings.run_id or f"trl-{uuid.uuid4().hex[:8]}"
        self._factory = client_factory or self._default_client
        self._loop = _Loop(loop)
        self._client: _Client | None = None
        self._synced_step: int | None = None
        self._saved: list[Path] = []

    def _default_client(self) -> _Client:
        s = self.settings
        return RolloutClient(s.rollout_address, token=s.token, timeout_s=s.rpc_timeout_s)

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        """Sample the batch's groups through Polar and return TRL's rows (see the module docstring)."""
        training = bool(trainer.model.training)
        group_size = int(trainer.num_generations if training else trainer.num_generations_eval)
        heads = _groups(prompts, group_size)
        self.sync_policy(trainer)
        tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
        end = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.pad_token_id
        # Every process of a multi-process run submits its own slice of the batch, so its index is in the id.
        prefix = f"{self._run_id}-p{int(getattr(trainer.accelerator, 'process_index', 0))}"
        prefix += f"-s{int(trainer.state.global_step):05d}-c{self.stats.calls:04d}"
        instructions = [self._instruction_of(p) for p in heads]
        tasks = [
            self._template.task(f"{prefix}-g{i}", group_size=group_size, instruction=text)
            for i, text in enumerate(instructions)
        ]
        results = self._loop.run(self._sample(tasks))
        groups: list[GroupRows] = [
            group_rows(
                found,
                group_size=group_size,
                fallback_prompt_ids=list(tokenizer(text, add_special_tokens=False)["input_ids"]) or [int(end)],
                end_token_id=int(end),
                multi_trace=self.settings.multi_trace,
                failed_reward=self.settings.failed_reward,
            )
            for found, text in zip(results, instructions, strict=True)
        ]
        return self._output(groups)

    def _output(self, groups: Sequence[GroupRows]) -> dict[str, Any]:
        rows: list[Completion] = [row for g in groups for row in g.rows]
        failed = sum(g.failed_sessions for g in groups)
        refused = sum(g.refused_traces for g in groups)
        extra = sum(g.extra_traces for g in groups)
        s = self.stats
        s.calls += 1
        s.groups += len(groups)
        s.sessions += len(rows)
        s.failed_sessions += failed
        s.refused_traces += refused
        s.extra_traces += extra
        if refused:
            _log.warning("refused %d traces whose mask or logprobs differ in length from their tokens", refused)
        return {
            "prompt_ids": [r.prompt_ids for r in rows],
            "completion_ids": [r.completion_ids for r in rows],
            "logprobs": [r.logprobs for r in rows],
            "env_mask": [r.env_mask for r in rows],
            REWARD_KEY: [r.reward for r in rows],
            "polar_status": [r.status for r in rows],
            "polar_sampled_version": [r.policy_version for r in rows],
            # Scalars: TRL gives every row the same value; polar_reward logs them once per batch.
            "polar_failed_sessions": failed,
            "polar_refused_traces": refused,
            "polar_extra_traces": extra,
            "polar_policy_version": s.version,
        }

    async def _open(self) -> _Client:
        if self._client is None:
            self._client = self._factory()
        return self._client

    async def _sample(self, tasks: Sequence[task_pb2.Task]) -> list[list[session_pb2.SessionResult]]:
        client = await self._open()
        ids = []
        for task in tasks:
            reply = await client.submit(task, task_timeout_s=self.settings.task_timeout_s)
            if reply.already_existed:
                raise FailedPrecondition(f"task {reply.task_id} already exists: give the bridge a new run_id")
            ids.append(reply.task_id)
        return list(await asyncio.gather(*(self._collect(client, task_id) for task_id in ids)))

    async def _collect(self, client: _Client, task_id: str) -> list[session_pb2.SessionResult]:
        results: list[session_pb2.SessionResult] = []
        try:
            async with asyncio.timeout(self.settings.task_timeout_s + 60.0):
                async for result in client.watch(task_id):
                    results.append(result)
        except TimeoutError:
            _log.warning("task %s did not finish in time; its missing sessions count as failed", task_id)
            with contextlib.suppress(grpc.aio.AioRpcError):
                await client.cancel(task_id, "the TRL bridge stopped waiting")
        return results

    def sync_policy(self, trainer: Any) -> None:
        """Move the fleet to the trainer's weights if it stepped since the last sync.

        Each rollout call does this first; call it once more after ``trainer.train()`` to leave the fleet on the
        final weights (the last step has no rollout after it). The first call only reads the fleet's version:
        the fleet must then serve the weights the trainer starts from.
        """
        step = int(trainer.state.global_step)
        if self._synced_step is None:
            self.stats.version = self._loop.run(self._current_version())
            self._synced_step = step
            return
        if step == self._synced_step:
            return
        version = self.stats.version + 1
        accelerator = trainer.accelerator
        if accelerator.is_main_process:
            model = accelerator.unwrap_model(trainer.model)
            tokenizer = trainer.processing_class
            path = save_checkpoint(model, tokenizer, (self.settings.checkpoint_dir / f"v{version}").resolve())
            self._loop.run(self._update(version, path))
            self._saved.append(path)
            for old in self._saved[: -self.settings.keep_checkpoints]:
                shutil.rmtree(old, ignore_errors=True)
            self._saved = self._saved[-self.settings.keep_checkpoints :]
        accelerator.wait_for_everyone()  # the other processes sample only once the fleet has moved
        self.stats.version = version
        self.stats.policy_updates += 1
        self._synced_step = step

    async def _current_version(self) -> int:
        client = await self._open()
        return int((await client.get_policy()).policy.version)

    async def _update(self, version: int, path: Path) -> None:
        client = await self._open()
        reply = await client.update_policy(version, str(path), pause_mode=self.settings.pause_mode)
        if not reply.complete:
            failed = "; ".join(f"{p.address}: {p.error}" for p in reply.failed)
            raise FailedPrecondition(f"policy v{version} did not reach every proxy: {failed}")
        _log.info("the fleet serves policy v%d from %s", version, path)

    def close(self) -> None:
        """Close the client and stop the bridge's own event loop (from any thread but the client's loop)."""
        if self._client is not None:
            self._loop.run(self._client.close())
            self._client = None
        self._loop.close()

    async def aclose(self) -> None:
        """Close the client from the event loop it runs on (a ``loop`` given to the bridge)."""
        if self._client is not None:
            await self._client.close()
            self._client = None
        self._loop.close()


def polar_rollout_func(
    settings: TrlBridgeSettings,
    template: TaskTemplate,
    *,
    args: Any,
    instruction_of: Callable[[Any], str] | None = None,
    loop: asyncio.AbstractEventLoop | None = None,
    client_factory: Callable[[], _Client] | None = None,
) -> PolarRollout:
    """Check the configuration and build the rollout function to pass as ``GRPOTrainer(rollout_func=...)``.

    Args:
        settings: The bridge's settings.
        template: Stamps each group's task (e.g. ``polar_train.tasks.load_template(...)``).
        args: The trainer's ``GRPOConfig``.
        instruction_of: Turns a TRL prompt into the task's instruction.
        loop: The event loop to run the client on (default: the bridge's own, in a thread).
        client_factory: Builds the client on that loop (default: :class:`polar_client.RolloutClient`).

    Raises:
        InvalidArgument: A group of size 1 (``num_generations`` or ``num_generations_eval`` below 2: GRPO's
            advantages would all be 0), ``use_vllm`` (Polar generates; TRL's vLLM would sit idle), or a template
            whose task does not carry ``num_generations`` samples (a task without samples).
    """
    sizes = {
        "num_generations": args.num_generations,
        "num_generations_eval": getattr(args, "num_generations_eval", None),
    }
    for name, size in sizes.items():
        if size is not None and int(size) < 2:
            raise InvalidArgument(f"{name} is {size}: a group of size 1 has no relative advantage; use 2 or more")
    if getattr(args, "use_vllm", False):
        raise InvalidArgument("use_vllm with the Polar bridge: Polar's fleet generates; turn use_vllm off")
    for size in {int(s) for s in sizes.values() if s is not None}:
        probe = template.task("polar-trl-probe", group_size=size, instruction="probe")
        if probe.num_samples != size:
            raise InvalidArgument(
                f"the task template gives {probe.num_samples} samples per task, not num_generations ({size}): "
                "each group must be one task with one sample per generation"
            )
    return PolarRollout(
        settings, template, instruction_of=instruction_of or _instruction, loop=loop, client_factory=client_factory
    )


def polar_reward(
    completions: list[Any],
    polar_reward: list[float | None] | None = None,
    log_metric: Callable[[str, float], None] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """The reward function to pass with the bridge: each row's Polar reward (the evaluator's), as is.

    It also logs the batch's Polar counts through TRL's ``log_metric``: ``polar/failed_sessions``,
    ``polar/refused_traces``, ``polar/extra_traces`` and ``polar/policy_version``.

    Raises:
        InvalidArgument: The rows did not come from the Polar rollout function.
    """
    if polar_reward is None or len(polar_reward) != len(completions):
        raise InvalidArgument("polar_reward needs GRPOTrainer(rollout_func=polar_rollout_func(...))")
    if log_metric is not None:
        for key in ("polar_failed_sessions", "polar_refused_traces", "polar_extra_traces", "polar_policy_version"):
            values = kwargs.get(key)
            if values:
                log_metric(f"polar/{key.removeprefix('polar_')}", float(values[0]))
    return list(polar_reward)
