"""The verl bridge with the real verl: its registry, its agent-loop worker and its batch, against a real stack.

verl lives in its own environment (``.venv-verl``, ``scripts/setup_verl.sh``: verl pinned, no-deps, with the
few packages its agent-loop and protocol modules import, CPU torch); the test skips without it. The embedded
Polar stack runs here (tiny tokenizer, scripted backend, the ``command`` harness in the local sandbox, the
``session_completed`` evaluator); ``integration_tests/support/verl_driver.py`` runs under ``.venv-verl`` as a
subprocess, registers ``PolarAgentLoop``, builds verl's real ``AgentLoopWorker`` with the agent-loop config file
``docs/training.md`` shows, and has it generate a batch of four rows over gRPC through ``polar_client``:

* rows 0 and 1: the template task (two model calls, prefix-merged into one trace: mask 1 on both replies, 0 on
  the user turn between them);
* row 2: its own task from ``extra_info.polar_task``, reconstructed per request (two traces: the longest is
  taken, the other is dropped and counted);
* row 3: an agent that exits 3 before calling the model (``infra_error``): reward 0, mask all 0.

Before generating, the driver runs the bridge's wrap of verl's weight sync (``stamp_after_weight_sync``) on a
stand-in checkpoint manager, so the proxy stamps verl's step (7) on every call.

The test checks verl's ``DataProto`` against the session results the rollout server holds: every row's prompt
(left-padded) and response (right-padded) tokens, its mask, its behaviour log-probabilities, its reward in
``rm_scores`` at the last response token, and the bridge's columns.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from polar_client import RolloutClient
from polar_core.model_fixtures import save_tiny_model
from polar_run.embedded import EmbeddedStack, StackOptions

REPO = Path(__file__).resolve().parents[1]
VERL_PYTHON = REPO / ".venv-verl" / "bin" / "python"
DRIVER = REPO / "integration_tests" / "support" / "verl_driver.py"
PROMPT_LENGTH = 256
RESPONSE_LENGTH = 128
VERL_STEP = 7

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not VERL_PYTHON.exists(), reason="no .venv-verl (scripts/setup_verl.sh creates it)"),
    pytest.mark.skipif(shutil.which("git") is None, reason="git is needed for the workspace"),
]

AGENT = """
import json, os, urllib.request
messages = [{"role": "user", "content": "Say hello."}]
for turn in range(2):
    body = json.dumps({"model": os.environ["POLAR_MODEL"], "messages": messages, "max_tokens": 32}).encode()
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
    )
    reply = json.loads(urllib.request.urlopen(request, timeout=120).read())
    messages.append(reply["choices"][0]["message"])
    messages.append({"role": "user", "content": "And again."})
open("answer.txt", "w").write("done\\n")
"""
FAILING_AGENT = "import sys; sys.stderr.write('no model call today\\n'); sys.exit(3)"


def _task(argv: list[str], strategy: str) -> dict[str, Any]:
    return {
        "instruction": "Say hello.",
        "timeout_seconds": 120,
        "harness": {"name": "command", "argv": argv},
        "runtime": {"kind": "local"},
        "builder": {"strategy": strategy},
        "evaluator": {"strategy": "session_completed"},
    }


def _agent_loop_config(path: Path, rollout_address: str, token: str, task: dict[str, Any]) -> Path:
    """The agent-loop config of docs/training.md ("verl"), with this stack's address and task."""
    entry = {
        "name": "polar",
        "_target_": "polar_train.bridges.verl.PolarAgentLoop",
        "rollout_address": rollout_address,
        "token": token,
        "task": task,
        "multi_trace": "longest",
        "task_timeout_s": 300,
    }
    path.write_text(json.dumps([entry]))  # JSON is YAML: OmegaConf.load reads it
    return path


async def _run_driver(spec: dict[str, Any], tmp: Path) -> dict[str, Any]:
    spec_path, out_path = tmp / "spec.json", tmp / "out.json"
    spec_path.write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POLAR_", "VIRTUAL_ENV"))}
    env.update(no_proxy="*", NO_PROXY="*", TOKENIZERS_PARALLELISM="false", RAY_DEDUP_LOGS="0")
    # Not subprocess.run: the stack serves from this event loop while verl's side runs.
    process = await asyncio.create_subprocess_exec(
        str(VERL_PYTHON), str(DRIVER), str(spec_path), str(out_path),
        cwd=tmp, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await process.communicate()
    assert process.returncode == 0, output.decode(errors="replace")[-6000:]
    result: dict[str, Any] = json.loads(out_path.read_text())
    return result


def _tensor(out: dict[str, Any], key: str) -> list[list[Any]]:
    data: list[list[Any]] = out["batch"][key]["data"]
    return data


async def test_verl_runs_polar_sessions_into_its_batch(tmp_path: Path) -> None:
    model = save_tiny_model(tmp_path / "tiny", seed=0)
    script = tmp_path / "script.jsonl"
    script.write_text('{"text": "Hello there, friend."}\n{"text": "Hello again."}\n')
    options = StackOptions(
        state_dir=tmp_path / "state",
        model=str(model),
        backend="scripted",
        backend_options={"script": str(script)},
        context_length=4096,
        running_workers=4,
        init_workers=2,
        postrun_workers=2,
        max_attempts=1,
        task_roots=(tmp_path,),
    )
    agent = [sys.executable, "-c", AGENT]
    template = _task(agent, "prefix-merge")
    async with EmbeddedStack.start(options) as stack:
        config = _agent_loop_config(tmp_path / "agent_loop.yaml", stack.rollout_address, stack.token, template)
        rows = [
            {"raw_prompt": [{"role": "user", "content": "Say hello."}], "extra_info": {}, "index": 0},
            {"raw_prompt": [{"role": "user", "content": "Say hello."}], "extra_info": {}, "index": 0},
            {
                "raw_prompt": [{"role": "user", "content": "Say hello twice."}],
                "extra_info": {"polar_task": _task(agent, "per-request")},
                "index": 1,
            },
            {
                "raw_prompt": [{"role": "user", "content": "Fail."}],
                "extra_info": {"polar_task": _task([sys.executable, "-c", FAILING_AGENT], "prefix-merge")},
                "index": 2,
            },
        ]
        spec = {
            "model_dir": str(model),
            "prompt_length": PROMPT_LENGTH,
            "response_length": RESPONSE_LENGTH,
            "agent_loop_config": str(config),
            "rows": rows,
            "proxy_address": stack.proxy_address,
            "token": stack.token,
            "stamp_step": VERL_STEP,
        }
        out = await _run_driver(spec, tmp_path)

        async with RolloutClient(stack.rollout_address, token=stack.token) as client:
            results = []
            for task_id in out["non_tensor"]["polar_task_id"]:
                (result,) = [r async for r in client.results(task_id)]
                results.append(result)

    # verl's registry holds the loop by name, as a subclass of its AgentLoopBase.
    assert out["verl_version"] == out["pinned_version"] == "0.9.1"
    assert out["registered"] == {"_target_": "polar_train.bridges.verl.PolarAgentLoop"}
    assert out["registered_after_worker"]["_target_"] == "polar_train.bridges.verl.PolarAgentLoop"
    assert out["is_subclass"]
    assert out["output_type"] == "DataProto"
    assert out["batch_size"] == 4
    # verl's weight sync ran (synchronously, then awaited) and each time the proxy was stamped with its step.
    assert out["synced_steps"] == [VERL_STEP - 1, VERL_STEP]

    # verl's batch: fixed widths, one row per sample.
    for key, width in [
        ("prompts", PROMPT_LENGTH),
        ("responses", RESPONSE_LENGTH),
        ("response_mask", RESPONSE_LENGTH),
        ("rollout_log_probs", RESPONSE_LENGTH),
        ("rm_scores", RESPONSE_LENGTH),
        ("input_ids", PROMPT_LENGTH + RESPONSE_LENGTH),
        ("attention_mask", PROMPT_LENGTH + RESPONSE_LENGTH),
        ("position_ids", PROMPT_LENGTH + RESPONSE_LENGTH),
    ]:
        assert out["batch"][key]["shape"] == [4, width], key
    columns = out["non_tensor"]
    assert [r.status for r in results] == ["resolved", "resolved", "resolved", "infra_error"]
    assert columns["polar_status"] == [r.status for r in results]
    assert columns["polar_failed"] == [False, False, False, True]
    assert columns["polar_session_id"] == [r.session_id for r in results]
    assert [len(r.traces) for r in results[:3]] == [1, 1, 2]
    assert columns["polar_traces"][:3] == [1, 1, 2]
    assert columns["polar_dropped_traces"] == [0, 0, 1, 0]
    assert columns["polar_refused_traces"] == [0, 0, 0, 0]
    assert columns["__num_turns__"] == [4, 4, 4, 0]
    # Every call was served under the version stamped from verl's step, and the batch says so (the rollout
    # server's fleet version did not move: see docs/training.md, "verl", on the gap).
    assert columns["polar_policy_versions"] == [["7"], ["7"], ["7"], []]

    for row, result in enumerate(results[:3]):
        trace = max(result.traces, key=lambda t: (sum(t.loss_mask), t.trace_index))
        prompt, response = list(trace.prompt_token_ids), list(trace.response_token_ids)
        n = len(response)
        assert columns["polar_trace_index"][row] == trace.trace_index
        # The prompt is left-padded, the response right-padded, the attention mask covers both.
        assert _tensor(out, "prompts")[row][PROMPT_LENGTH - len(prompt) :] == prompt
        assert _tensor(out, "responses")[row][:n] == response
        attention = _tensor(out, "attention_mask")[row]
        assert sum(attention[:PROMPT_LENGTH]) == len(prompt)
        assert sum(attention[PROMPT_LENGTH:]) == n
        # The mask is the trace's loss mask, the log-probabilities the proxy's, 0 elsewhere.
        mask = _tensor(out, "response_mask")[row]
        assert mask[:n] == list(trace.loss_mask)
        assert not any(mask[n:])
        logprobs = _tensor(out, "rollout_log_probs")[row]
        for position, (m, lp) in enumerate(zip(trace.loss_mask, trace.response_logprobs, strict=True)):
            assert logprobs[position] == pytest.approx(lp if m else 0.0, abs=1e-5)
        assert not any(logprobs[n:])
        # The session's reward sits at the last response token.
        scores = _tensor(out, "rm_scores")[row]
        assert scores[n - 1] == pytest.approx(result.reward)
        assert sum(scores) == pytest.approx(result.reward)
        assert result.reward == 1.0
    # Prefix-merged: both replies sampled (mask 1), the user turn between them not (mask 0).
    merged = results[0].traces[0].loss_mask
    assert 0 in merged
    assert merged[0] == 1
    assert merged[-1] == 1
    # The failed session: reward 0, nothing trainable.
    assert not any(_tensor(out, "response_mask")[3])
    assert not any(_tensor(out, "rm_scores")[3])
    assert "exit" in columns["polar_error"][3] or columns["polar_error"][3]
