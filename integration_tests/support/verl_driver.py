"""The verl side of ``test_verl_bridge.py``: run under ``.venv-verl/bin/python`` (the real verl), never imported.

``python verl_driver.py SPEC.json OUT.json``. SPEC holds the rollout server's address and token, the tokenizer
directory (a Hugging Face model directory verl's model config reads), the agent-loop config file to use
(``agent_loop_config_path``: the one ``docs/training.md`` shows, with the test's Polar settings) and the rows
of the generation batch. The driver

1. registers the loop with :func:`polar_train.bridges.verl.register_polar_loop` and checks verl's registry;
2. builds verl's real ``AgentLoopWorker`` from verl's own generated trainer config (CPU: no Ray, no server:
   the loop never calls verl's ``server_manager``), which loads the agent-loop config file;
3. calls its ``generate_sequences`` on a ``DataProto`` of the rows: verl instantiates the loop by name with
   hydra for each row, runs it, pads each output (``_agent_loop_postprocess``) and stacks them into its batch
   (``_postprocess``);

Before that, as ``RayPPOTrainer`` does after its weight sync, it calls the ``update_weights`` of a stand-in for
verl's checkpoint manager (verl's ``auto_await``, as the real one) wrapped by
:func:`polar_train.bridges.verl.stamp_after_weight_sync`: once synchronously (step ``stamp_step - 1``) and once
awaited (``stamp_step``), so the proxy stamps verl's step on the calls the rows make. It writes the batch's
tensors and non-tensor columns, and the steps the stand-in synced, to OUT as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any


def _config(spec: dict[str, Any]) -> Any:
    import verl.trainer.config  # type: ignore[import-not-found]
    from omegaconf import OmegaConf  # type: ignore[import-not-found]

    generated = Path(verl.trainer.config.__file__).parent / "_generated_ppo_trainer.yaml"
    config = OmegaConf.load(generated)
    config.actor_rollout_ref.model.path = spec["model_dir"]
    rollout = config.actor_rollout_ref.rollout
    rollout.name = "vllm"  # a mandatory value; nothing here starts a server
    rollout.prompt_length = spec["prompt_length"]
    rollout.response_length = spec["response_length"]
    rollout.calculate_log_probs = True
    rollout.agent.agent_loop_config_path = spec["agent_loop_config"]
    rollout.agent.default_agent_loop = "polar"
    return config


def _checkpoint_manager(spec: dict[str, Any]) -> Any:
    """A stand-in for verl's ``CheckpointEngineManager`` (its ``update_weights`` only), wrapped by the bridge."""
    from verl.utils.ray_utils import auto_await  # type: ignore[import-not-found]

    from polar_train.bridges.verl import stamp_after_weight_sync

    class Checkpoints:
        def __init__(self) -> None:
            self.synced: list[int | None] = []

        @auto_await  # type: ignore[misc]
        async def update_weights(self, global_steps: int | None = None) -> None:
            self.synced.append(global_steps)

    manager = Checkpoints()
    stamp_after_weight_sync(manager, [spec["proxy_address"]], token=spec["token"])
    return manager


def _jsonable(value: Any) -> Any:
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        return {"dtype": str(value.dtype), "shape": list(value.shape), "data": value.tolist()}
    if isinstance(value, np.ndarray):
        return [_jsonable(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


async def _main(spec: dict[str, Any], manager: Any) -> dict[str, Any]:
    import numpy as np
    from omegaconf import OmegaConf  # type: ignore[import-not-found]
    from verl.experimental.agent_loop import agent_loop  # type: ignore[import-not-found]
    from verl.protocol import DataProto  # type: ignore[import-not-found]

    from polar_train.bridges.verl import AGENT_NAME, VERL_VERSION, register_polar_loop

    await manager.update_weights(spec["stamp_step"])  # awaited, from a coroutine
    loop_class = register_polar_loop()
    registered = dict(agent_loop._agent_loop_registry[AGENT_NAME])
    is_subclass = issubclass(loop_class, agent_loop.AgentLoopBase)

    worker = agent_loop.AgentLoopWorker(_config(spec), llm_client=None)
    rows = spec["rows"]
    batch = DataProto.from_single_dict(
        {
            "raw_prompt": np.array([r["raw_prompt"] for r in rows], dtype=object),
            "extra_info": np.array([r["extra_info"] for r in rows], dtype=object),
            "index": np.array([r["index"] for r in rows], dtype=object),
            "agent_name": np.array([AGENT_NAME] * len(rows), dtype=object),
        },
        meta_info={"global_steps": 1, "validate": False},
    )
    after_worker = agent_loop._agent_loop_registry[AGENT_NAME]  # the config file's entry, loaded by the worker
    output = await worker.generate_sequences(batch)
    import verl  # type: ignore[import-not-found]

    return {
        "verl_version": getattr(verl, "__version__", ""),
        "pinned_version": VERL_VERSION,
        "registered": registered,
        "registered_after_worker": OmegaConf.to_container(OmegaConf.create(after_worker)),
        "is_subclass": is_subclass,
        "output_type": type(output).__name__,
        "batch_size": len(output),
        "batch": {key: _jsonable(output.batch[key]) for key in output.batch.keys()},  # noqa: SIM118  # a TensorDict
        "non_tensor": {key: _jsonable(value) for key, value in output.non_tensor_batch.items()},
        "meta_keys": sorted(output.meta_info),
        "synced_steps": list(manager.synced),
    }


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    manager = _checkpoint_manager(spec)
    manager.update_weights(spec["stamp_step"] - 1)  # synchronously, as RayPPOTrainer.fit calls it
    result = asyncio.run(_main(spec, manager))
    Path(sys.argv[2]).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
