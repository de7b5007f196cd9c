"""verl's agent loop over Polar: each sample of verl's batch is one Polar session (pinned: verl 0.9.1).

verl (``verl.experimental.agent_loop``) runs one ``AgentLoopBase.run(sampling_params, **sample)`` per row of its
generation batch and pads the returned ``AgentLoopOutput`` objects into its ``DataProto`` batch. The loop here,
registered as ``polar``, submits the sample as a one-session Polar task (``polar_client``), waits for the
session's result with its traces, and returns the trace as verl's output (``verl_convert`` says field by field
how, what happens to sessions split into several traces, failed sessions and malformed traces).

The harness reaches the model through the Polar model proxy, whose backend is the trainer's own inference
servers (the proxy's ``vllm`` or ``sglang`` backend pointed at verl's rollout server addresses), so the tokens
and log-probabilities come from the weights verl trains. See ``docs/training.md``, "verl", for the config.

verl is imported only when the loop class is first asked for (``PolarAgentLoop``, :func:`register_polar_loop`),
so this module imports without verl; hydra's ``_target_: polar_train.bridges.verl.PolarAgentLoop`` (verl's
``agent_loop_config_path``) asks for it by name, which builds and registers the class in that process.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from polar.common.v1 import session_pb2, task_pb2
from polar.proxy.v1 import model_proxy_service_pb2 as proxy_pb
from polar.proxy.v1 import model_proxy_service_pb2_grpc as proxy_grpc
from pydantic import BaseModel, ConfigDict, Field

from polar_client import ClientSettings, RolloutClient, load_task, task_from_mapping
from polar_core.channels import open_channel
from polar_core.errors import InvalidArgument
from polar_core.policy_version import format_version
from polar_train.bridges.fleet_version import stamp_fleet_version
from polar_train.bridges.verl_convert import MultiTrace, VerlSample, convert_session

__all__ = [
    "AGENT_NAME",
    "VERL_VERSION",
    "PolarLoopSettings",
    "register_polar_loop",
    "run_session",
    "session_task",
    "stamp_after_weight_sync",
    "stamp_policy_version",
    "to_agent_loop_output",
]

AGENT_NAME = "polar"
"""The name the loop is registered under (a dataset row's ``agent_name``, or ``agent.default_agent_loop``)."""
VERL_VERSION = "0.9.1"
"""The verl release this bridge is written and tested against (``scripts/setup_verl.sh`` installs it)."""

_log = logging.getLogger(__name__)


class PolarLoopSettings(BaseModel):
    """The Polar side of the loop, from the ``polar`` section of verl's config and the agent-loop entry.

    Attributes:
        rollout_address: ``host:port`` of the rollout server (default ``POLAR_SERVER``).
        token: The control-plane token (default ``POLAR_TOKEN``).
        task: The task template: a TASK.yaml path (absolute, or relative to verl's working directory) or its
            mapping. A sample's ``extra_info.polar_task`` (a path or a mapping) replaces it for that sample.
        instruction_key: The ``extra_info`` key holding the sample's instruction; without it, the content of the
            prompt's last user message; without either, the template's instruction.
        multi_trace: Which trace of a session split into several becomes the sample (``longest`` or ``last``).
        task_timeout_s: Deadline of each one-session task on the rollout server.
        wait_timeout_s: How long the loop waits for the session's result before cancelling the task and zeroing
            the sample (0: ``task_timeout_s`` plus 300 s for the queue, evaluation and reconstruction).
        task_id_prefix: Prefix of the task ids the loop submits (a fresh id per sample).
        rpc_timeout_s: Deadline of each unary call to the rollout server.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    rollout_address: str = Field(default_factory=lambda: ClientSettings().server)
    token: str = Field(default_factory=lambda: ClientSettings().token)
    task: str | dict[str, Any] | None = None
    instruction_key: str = "instruction"
    multi_trace: MultiTrace = "longest"
    task_timeout_s: float = Field(default=600.0, gt=0)
    wait_timeout_s: float = Field(default=0.0, ge=0)
    task_id_prefix: str = "verl-"
    rpc_timeout_s: float = Field(default=60.0, gt=0)

    @property
    def wait_s(self) -> float:
        """How long to wait for a session's result."""
        return self.wait_timeout_s or self.task_timeout_s + 300.0

    @classmethod
    def merged(cls, *sources: Mapping[str, Any] | None) -> PolarLoopSettings:
        """Settings from mappings, a later source's keys over an earlier one's."""
        values: dict[str, Any] = {}
        for source in sources:
            values.update(source or {})
        return cls(**values)


def _last_user_text(raw_prompt: Any) -> str:
    for message in reversed(list(raw_prompt or ())):
        if isinstance(message, Mapping) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, Sequence):  # OpenAI content parts: keep the text ones
                return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def session_task(
    settings: PolarLoopSettings, extra_info: Mapping[str, Any] | None, raw_prompt: Any, *, task_id: str
) -> task_pb2.Task:
    """The one-session task of a sample: the template (or the sample's own), its instruction, a fresh id.

    Raises:
        InvalidArgument: No task anywhere, or a malformed one.
    """
    extra = dict(extra_info or {})
    source = extra.get("polar_task", settings.task)
    if source is None:
        raise InvalidArgument("no Polar task: set polar.task or the sample's extra_info.polar_task")
    task = task_from_mapping(source) if isinstance(source, Mapping) else load_task(str(source))
    task.task_id = task_id
    task.num_samples = 1
    instruction = extra.get(settings.instruction_key) or _last_user_text(raw_prompt)
    if instruction:
        task.instruction = str(instruction)
    return task


async def run_session(
    client: RolloutClient, task: task_pb2.Task, settings: PolarLoopSettings
) -> tuple[session_pb2.SessionResult | None, str]:
    """Submit the one-session ``task`` and wait for its result (``None`` and why, when none comes in time).

    Raises:
        grpc.aio.AioRpcError: The rollout server refused the task (a configuration error: it is not a failed
            session, and zeroing every sample would hide it).
    """
    reply = await client.submit(task, task_timeout_s=settings.task_timeout_s)
    try:
        async with asyncio.timeout(settings.wait_s):
            async for result in client.watch(reply.task_id):
                return result, ""
        return None, "the task ended without a session result"
    except TimeoutError:
        with contextlib.suppress(grpc.aio.AioRpcError):
            await client.cancel(reply.task_id, "verl bridge: no session result in time")
        return None, f"no session result within {settings.wait_s:g} s"
    except grpc.aio.AioRpcError as exc:
        return None, f"watching task {reply.task_id} failed: {exc.code().name}: {exc.details()}"


def to_agent_loop_output(sample: VerlSample, seconds: float, output_type: Any) -> Any:
    """Build verl's ``AgentLoopOutput`` (``output_type``) from a converted sample."""
    return output_type(
        prompt_ids=sample.prompt_ids,
        response_ids=sample.response_ids,
        response_mask=sample.response_mask,
        response_logprobs=sample.response_logprobs,
        reward_score=sample.reward,
        num_turns=sample.num_turns,
        metrics={"generate_sequences": seconds},
        # turn_scores and tool_rewards keep the schema of verl's own loops, so batches concatenate.
        extra_fields={"turn_scores": [], "tool_rewards": [], **sample.extra_fields()},
    )


async def stamp_policy_version(
    version: int, proxy_addresses: Sequence[str], *, token: str = "", timeout_s: float = 30.0
) -> dict[str, str]:
    """Set the policy version stamped on new calls on each proxy, for weights verl synced itself.

    Calls each proxy's ``SetPolicyVersion`` (no weights are loaded). Call it after verl's weight sync and before
    the next generation (verl's synchronous trainer sleeps its rollout replicas between the two, so no call
    straddles the sync). This is per proxy: the rollout server's fleet version (``GetPolicy``) does not move,
    see ``docs/training.md``, "verl".

    Returns:
        Each proxy address's previous version.

    Raises:
        grpc.aio.AioRpcError: A proxy refused or did not answer.
    """
    previous: dict[str, str] = {}
    for address in proxy_addresses:
        channel = open_channel(address, auth_token=token)
        try:
            stub = proxy_grpc.ModelProxyServiceStub(channel)
            reply = await stub.SetPolicyVersion(
                proxy_pb.SetPolicyVersionRequest(policy_version=format_version(version)), timeout=timeout_s
            )
            previous[address] = reply.previous_policy_version
        finally:
            await channel.close(None)
    return previous


def stamp_after_weight_sync(
    checkpoint_manager: Any, proxy_addresses: Sequence[str] = (), *, token: str = "", rollout_address: str = ""
) -> None:
    """Make verl's ``checkpoint_manager.update_weights(global_steps)`` stamp ``global_steps`` on the proxies.

    With ``rollout_address`` the whole fleet is stamped through the rollout server
    (:func:`polar_train.bridges.fleet_version.stamp_fleet_version`: ``UpdatePolicy`` with ``weights_synced``), so
    its fleet version, ``max_policy_lag`` and proxies that start later follow verl's steps; otherwise each of
    ``proxy_addresses`` is stamped directly (:func:`stamp_policy_version`; the fleet version does not move).

    Replaces the manager's ``update_weights`` (verl's ``CheckpointEngineManager``, which ``RayPPOTrainer`` calls
    after each step, synchronously or awaited) with one that runs verl's own sync and then
    :func:`stamp_policy_version` with the step; wrapped in verl's ``auto_await`` like the original, so both ways
    of calling it keep working.

    Raises:
        ImportError: verl is not installed.
    """
    from verl.utils.ray_utils import auto_await  # type: ignore[import-not-found]  # .venv-verl only

    sync = checkpoint_manager.update_weights
    addresses = tuple(proxy_addresses)

    @auto_await  # type: ignore[untyped-decorator]
    async def update_weights(global_steps: int | None = None) -> None:
        await sync(global_steps)
        if global_steps is None:
            return
        if rollout_address:
            await stamp_fleet_version(rollout_address, global_steps, token=token)
        else:
            await stamp_policy_version(global_steps, addresses, token=token)

    checkpoint_manager.update_weights = update_weights


def _plain(value: Any) -> Any:
    """An OmegaConf node (verl's config, hydra's kwargs) as plain Python containers."""
    from omegaconf import OmegaConf  # type: ignore[import-not-found]  # verl's dependency, in .venv-verl only

    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


@functools.cache
def _agent_loop_class() -> type[Any]:
    """Build ``PolarAgentLoop`` on verl's ``AgentLoopBase`` and register it as ``polar`` (once per process)."""
    from verl.experimental.agent_loop.agent_loop import (  # type: ignore[import-not-found]  # .venv-verl only
        AgentLoopBase,
        AgentLoopOutput,
        register,
    )

    class PolarAgentLoop(AgentLoopBase):  # type: ignore[misc, valid-type]
        """One Polar session per sample; settings from the config's ``polar`` section and the loop's entry."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            own = {k: _plain(kwargs.pop(k)) for k in list(kwargs) if k in PolarLoopSettings.model_fields}
            kwargs.pop("name", None)  # the agent-loop entry's own name, passed on by hydra
            super().__init__(*args, **kwargs)
            section = _plain(self.config.get("polar")) if hasattr(self.config, "get") else None
            self.settings = PolarLoopSettings.merged(section, own)

        async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
            started = time.monotonic()
            extra_info = _plain(kwargs.get("extra_info")) or {}
            raw_prompt = _plain(kwargs.get("raw_prompt"))
            task = session_task(
                self.settings, extra_info, raw_prompt, task_id=f"{self.settings.task_id_prefix}{uuid.uuid4().hex}"
            )
            async with RolloutClient(
                self.settings.rollout_address, token=self.settings.token, timeout_s=self.settings.rpc_timeout_s
            ) as client:
                result, error = await run_session(client, task, self.settings)
            sample = convert_session(
                result,
                prompt_length=int(self.rollout_config.prompt_length),
                response_length=int(self.rollout_config.response_length),
                fallback_prompt_ids=self._fallback_prompt(raw_prompt, task.instruction),
                pad_token_id=self._pad_token_id(),
                multi_trace=self.settings.multi_trace,
                error=error,
            )
            if sample.failed:
                _log.warning("Polar task %s zeroed (%s): %s", task.task_id, sample.status, sample.error)
            return to_agent_loop_output(sample, time.monotonic() - started, AgentLoopOutput)

        def _pad_token_id(self) -> int:
            pad = getattr(self.tokenizer, "pad_token_id", None)
            return int(pad) if pad is not None else 0

        def _fallback_prompt(self, raw_prompt: Any, instruction: str) -> list[int]:
            """The prompt of a failed session without a trace: only its shape matters (its mask is 0)."""
            text = _last_user_text(raw_prompt) or instruction
            ids = list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []
            return ids[-int(self.rollout_config.prompt_length) :]

    PolarAgentLoop.__module__ = __name__
    PolarAgentLoop.__qualname__ = "PolarAgentLoop"
    registered: type[Any] = register(AGENT_NAME)(PolarAgentLoop)
    return registered


def register_polar_loop() -> type[Any]:
    """Import verl, build ``PolarAgentLoop`` and register it in verl's agent-loop registry as ``polar``.

    Raises:
        ImportError: verl is not installed.
    """
    return _agent_loop_class()


def __getattr__(name: str) -> Any:
    # PEP 562: ``PolarAgentLoop`` exists once asked for, so importing this module never imports verl, while
    # hydra's ``_target_: polar_train.bridges.verl.PolarAgentLoop`` still finds the class by name.
    if name == "PolarAgentLoop":
        return _agent_loop_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
