"""UpdatePolicy refuses unfit checkpoints before anything is paused or stored, through real servers.

A real rollout server and real model proxies that register with it: one on the in-process transformers backend
(the tiny model), one on a real vLLM CPU server. Each is given checkpoints whose ``config.json`` matches (or
whose only change is ``intermediate_size``) but whose tensors do not: one of the wrong shape, one missing, one
extra, another intermediate size, one of another dtype. Every one must end in ``FAILED_PRECONDITION`` naming the
proxy and each unfit tensor, with nothing paused, nothing stored, and the next call served on the old version
by the old weights. A load that fails after the check passed resumes the proxy on its old weights, stores
nothing, and a restarted proxy serves the old version at once.
"""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from transformers import AutoModelForCausalLM

from integration_tests.support.backends import backend_venv_python, run_vllm
from integration_tests.test_policy_update import TOKEN, Fleet, registered
from model_proxy.backends.tests.unfit_checkpoints import UNFIT_CASES, write_unfit_checkpoints
from polar_client import RolloutClient
from polar_core.model_fixtures import save_tiny_model, teacher_forced_logprobs
from rollout_server.clients import GrpcProxyClient

VLLM_PYTHON = backend_venv_python("vllm")


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    f = Fleet(tmp_path)
    yield f
    await f.close()


def _logprob_gap(model_dir: Path, record: Any) -> float:
    loader: Any = AutoModelForCausalLM
    model = loader.from_pretrained(model_dir).eval()
    expected = teacher_forced_logprobs(model, list(record.prompt_token_ids), list(record.response_token_ids))
    return float(max(abs(a - b) for a, b in zip(record.response_logprobs, expected, strict=True)))


async def _refused_everywhere(client: RolloutClient, fleet: Fleet, unfit: dict[str, Path]) -> None:
    """Each unfit checkpoint: FAILED_PRECONDITION naming every proxy and problem; nothing paused or stored."""
    for name, path in unfit.items():
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await client.update_policy(1, str(path))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, name
        details = refused.value.details() or ""
        assert "nothing was paused or stored" in details
        for proxy in fleet.proxies:
            assert f"{proxy.address} ({proxy.proxy_id}) rejected" in details, (name, details)
        for pattern in UNFIT_CASES[name]:
            assert re.search(pattern, details), (name, pattern, details)
        for proxy in fleet.proxies:
            served = await proxy.policy()
            assert (served.policy_version, served.weights_path, served.paused) == ("0", "", False), name
        state = await client.get_policy()
        assert (state.policy.version, state.policy.weights_path) == (0, "")
        assert all((p.version, p.paused) == (0, False) for p in state.proxies)


async def test_transformers_proxy_refuses_unfit_tensors_and_keeps_serving(fleet: Fleet, tmp_path: Path) -> None:
    dir_a = save_tiny_model(tmp_path / "ckpt" / "a", seed=0)
    dir_b = save_tiny_model(tmp_path / "ckpt" / "b", seed=1)
    unfit = write_unfit_checkpoints(dir_b, tmp_path / "ckpt" / "unfit")
    await fleet.start_rollout(f"sqlite:///{tmp_path / 'rollout.sqlite3'}")
    proxy = await fleet.add_proxy("tf", model=str(dir_a), backend="transformers", backend_options={})
    async with RolloutClient(fleet.target, token=TOKEN) as client:
        await registered(client, 1)
        await _refused_everywhere(client, fleet, unfit)
        record = await proxy.chat("after-refusals")
        assert record.policy_version == "0"
        assert _logprob_gap(dir_a, record) < 1e-4  # still A's weights
        update = await client.update_policy(1, str(dir_b))  # a fit checkpoint goes through afterwards
        assert update.complete
        assert (await proxy.chat("after-update")).policy_version == "1"


class VanishingCheckpoint(GrpcProxyClient):
    """The real client, except that the checkpoint is moved away just before LoadWeights (after the check passed)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.loads = 0

    async def load_weights(self, address: str, policy_version: int, weights_path: str) -> float:
        self.loads += 1
        gone = Path(weights_path + ".gone")
        shutil.move(weights_path, gone)
        try:
            return await super().load_weights(address, policy_version, weights_path)
        finally:
            shutil.move(gone, weights_path)


async def test_a_load_that_fails_after_the_check_stores_nothing_and_resumes(fleet: Fleet, tmp_path: Path) -> None:
    dir_a = save_tiny_model(tmp_path / "ckpt" / "a", seed=0)
    dir_b = save_tiny_model(tmp_path / "ckpt" / "b", seed=1)
    proxies = VanishingCheckpoint(auth_token=TOKEN, timeout_s=30)
    await fleet.start_rollout(f"sqlite:///{tmp_path / 'rollout.sqlite3'}", proxies)
    proxy = await fleet.add_proxy("tf", model=str(dir_a), backend="transformers", backend_options={})
    async with RolloutClient(fleet.target, token=TOKEN) as client:
        await registered(client, 1)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await client.update_policy(1, str(dir_b))
        assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = failed.value.details() or ""
        assert "no proxy could load" in details
        assert "nothing was stored" in details
        assert f"{proxy.address} (tf)" in details
        assert "is not a directory" in details
        assert proxies.loads == 1
        served = await proxy.policy()
        assert (served.policy_version, served.paused) == ("0", False)  # resumed on its old weights
        assert (await client.get_policy()).policy.version == 0
        assert (await proxy.chat("after-failed-load")).policy_version == "0"

        # A restart: the proxy registers again, is handed version 0 (nothing was stored) and serves at once.
        await proxy.stop()
        back = await fleet.add_proxy("tf", model=str(dir_a), backend="transformers", backend_options={})
        record = await back.chat("after-restart")
        assert record.policy_version == "0"
        assert _logprob_gap(dir_a, record) < 1e-4


# ----- vLLM ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vllm-weights")
    good = save_tiny_model(root / "a", seed=0, tie_word_embeddings=False)
    b = save_tiny_model(root / "b", seed=1, tie_word_embeddings=False)
    return {"a": good, "b": b} | write_unfit_checkpoints(b, root / "unfit")


@pytest.fixture(scope="module")
def vllm_url(vllm_checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if VLLM_PYTHON is None:
        pytest.skip("no .venv-vllm: run scripts/setup_backends.sh vllm")
    log = tmp_path_factory.mktemp("vllm-log") / "server.log"
    with run_vllm(
        VLLM_PYTHON, vllm_checkpoints["a"], log, max_model_len=512, env={"VLLM_SERVER_DEV_MODE": "1"}, timeout_s=900
    ) as (url, startup_s):
        print(f"vllm started in {startup_s:.1f} s", file=sys.stderr)
        yield url


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.skipif(VLLM_PYTHON is None, reason="no .venv-vllm: run scripts/setup_backends.sh vllm")
async def test_vllm_proxy_refuses_unfit_tensors_and_the_server_keeps_serving(
    fleet: Fleet, tmp_path: Path, vllm_url: str, vllm_checkpoints: dict[str, Path]
) -> None:
    dir_a = vllm_checkpoints["a"]
    unfit = {k: v for k, v in vllm_checkpoints.items() if k in UNFIT_CASES}
    await fleet.start_rollout(f"sqlite:///{tmp_path / 'rollout.sqlite3'}")
    options = {"url": vllm_url, "model": "tiny", "model_dir": str(dir_a)}
    proxy = await fleet.add_proxy("vllm", model=str(dir_a), backend="vllm", backend_options=options, context_length=512)
    async with RolloutClient(fleet.target, token=TOKEN) as client:
        await registered(client, 1)
        await _refused_everywhere(client, fleet, unfit)
        record = await proxy.chat("after-refusals")
        assert record.policy_version == "0"
        assert _logprob_gap(dir_a, record) < 1e-4  # the server still serves A
        update = await client.update_policy(1, str(vllm_checkpoints["b"]))
        assert update.complete
        after = await proxy.chat("after-update")
        assert after.policy_version == "1"
        assert _logprob_gap(vllm_checkpoints["b"], after) < 1e-4
