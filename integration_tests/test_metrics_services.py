"""The reconstructor's and the evaluator's Prometheus endpoints over real gRPC: one operation each, then a scrape."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
from pathlib import Path

import grpc
import pytest
from google.protobuf import struct_pb2
from polar.common.v1 import reconstruction_pb2, status_pb2, task_pb2
from polar.evaluator.v1 import evaluator_service_pb2 as epb
from polar.evaluator.v1 import evaluator_service_pb2_grpc as epb_grpc
from polar.reconstructor.v1 import reconstructor_service_pb2 as rpb
from polar.reconstructor.v1 import reconstructor_service_pb2_grpc as rpb_grpc

from evaluator.metrics import EVALUATOR_METRICS
from evaluator.server import start_server as start_evaluator
from evaluator.settings import EvaluatorSettings
from integration_tests.support.evaluator import example_spec
from integration_tests.support.prometheus import scrape
from integration_tests.support.services import POLAR_ARGV
from polar_core.channels import open_channel
from polar_core.convert import completion_to_proto
from reconstructor import ReconstructionOptions, reconstruct_session
from reconstructor.metrics import RECONSTRUCTOR_METRICS
from reconstructor.server import start_server as start_reconstructor
from reconstructor.settings import ReconstructorSettings
from reconstructor.synthetic import IM_END, SyntheticSpec, synthetic_session

ROOT = Path(__file__).resolve().parents[1]


async def test_reconstructor_counts_traces_merges_splits_and_tokens(tmp_path: Path) -> None:
    """One inline reconstruction and one refused request: the counters equal the reconstruction's own stats."""
    spec = SyntheticSpec(turns=10, retokenize_prob=0.3, truncate_prob=0.2, compaction_every=4, subagents=2)
    records = synthetic_session(random.Random(7), spec, "sess-1")
    expected = reconstruct_session(records, ReconstructionOptions(end_of_turn_ids=(IM_END,))).stats
    running = await start_reconstructor(ReconstructorSettings(state_dir=tmp_path, metrics_port=0))
    try:
        async with open_channel(f"127.0.0.1:{running.port}") as channel:
            stub = rpb_grpc.ReconstructorServiceStub(channel)
            request = rpb.ReconstructRequest(
                completions=rpb.CompletionList(completions=[completion_to_proto(r) for r in records]),
                strategy=reconstruction_pb2.RECONSTRUCTION_STRATEGY_PREFIX_MERGE,
                end_of_turn_token_ids=[IM_END],
                terminal_status=status_pb2.TERMINAL_STATUS_RESOLVED,
            )
            reply = await stub.Reconstruct(request, timeout=30)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Reconstruct(rpb.ReconstructRequest(), timeout=30)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        got = await asyncio.to_thread(scrape, running.app.metrics_port)
    finally:
        await running.stop(None)
    assert len(reply.traces) == expected.chains > 1
    assert expected.splits_by_reason
    assert got.value("polar_reconstructor_reconstructions_total", strategy="prefix-merge", status="ok") == 1
    assert got.value("polar_reconstructor_reconstructions_total", status="error", error_type="InvalidArgument") == 1
    assert got.value("polar_reconstructor_traces_total", strategy="prefix-merge") == expected.chains
    assert got.value("polar_reconstructor_merges_total") == expected.merges
    for reason, n in expected.splits_by_reason.items():
        assert got.value("polar_reconstructor_splits_total", reason=reason) == n
    assert got.value("polar_reconstructor_tokens_total", type="trainable") == expected.trainable_tokens
    assert got.value("polar_reconstructor_tokens_total", type="total") == expected.total_tokens
    assert got.value("polar_reconstructor_calls_total", outcome="used") == expected.calls - expected.aborted_calls
    assert got.value("polar_reconstructor_reconstruction_duration_seconds_count", status="ok") == 1
    got.check_declared(RECONSTRUCTOR_METRICS)


async def test_evaluator_counts_evaluations_prepares_and_the_prewarm(tmp_path: Path) -> None:
    """Prepare twice (the second reuses the handle), evaluate the reference fix: resolved, counted once each."""
    spec, fix = example_spec("paginate")
    options = struct_pb2.Struct()
    options.update({k: (str(v) if isinstance(v, Path) else v) for k, v in spec.options.items()})
    evaluator = task_pb2.EvaluatorSpec(strategy=spec.strategy, options=options)
    running = await start_evaluator(EvaluatorSettings(state_dir=tmp_path, metrics_port=0))
    try:
        async with open_channel(f"127.0.0.1:{running.port}") as channel:
            stub = epb_grpc.EvaluatorServiceStub(channel)
            prepare = epb.PrepareRequest(evaluator=evaluator, task_id="paginate", request_id="r1")
            prepared = await stub.Prepare(prepare, timeout=90)
            await stub.Prepare(prepare, timeout=90)
            artifacts = epb.EvaluationArtifacts(patch_bytes=fix, agent_status=epb.AGENT_STATUS_COMPLETED)
            reply = await stub.Evaluate(epb.EvaluateRequest(handle=prepared.handle, artifacts=artifacts), timeout=90)
        got = await asyncio.to_thread(scrape, running.app.metrics_port)
    finally:
        await running.stop(None)
    assert reply.terminal_status == status_pb2.TERMINAL_STATUS_RESOLVED
    assert got.value("polar_evaluator_evaluations_total", strategy=spec.strategy, status="resolved") == 1
    assert got.value("polar_evaluator_evaluation_duration_seconds_count", status="resolved") == 1
    assert got.value("polar_evaluator_evaluation_duration_seconds_sum", status="resolved") > 0
    assert got.value("polar_evaluator_prepares_total", outcome="prepared") == 1
    assert got.value("polar_evaluator_prepares_total", outcome="reused") == 1
    assert got.value("polar_evaluator_prewarm_total", result="miss") == 1
    assert got.value("polar_evaluator_evaluations_active") == 0
    got.check_declared(EVALUATOR_METRICS)


async def test_polar_serve_prints_and_serves_each_metrics_endpoint(tmp_path: Path) -> None:
    """``polar serve reconstructor evaluator`` with metrics ports set prints each endpoint, and each answers."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLAR_")}
    env |= {"POLAR_RECONSTRUCTOR_METRICS_PORT": "0", "POLAR_EVALUATOR_METRICS_PORT": "0",
            "POLAR_EVALUATOR_TASK_ROOTS": json.dumps([str(tmp_path)])}  # fmt: skip
    argv = [*POLAR_ARGV, "serve", "reconstructor", "evaluator", "--state-dir", str(tmp_path / "state")]
    proc = await asyncio.create_subprocess_exec(*argv, env=env, stdout=asyncio.subprocess.PIPE, cwd=ROOT)
    assert proc.stdout is not None
    endpoints: dict[str, str] = {}
    grpc_ports: dict[str, int] = {}
    token = ""
    try:
        async with asyncio.timeout(120):
            while not token:  # printed once every service has started
                line = (await proc.stdout.readline()).decode().strip()
                assert line, "polar serve exited"
                token = line.removeprefix("control-plane token: ") if line.startswith("control-plane token:") else ""
                if match := re.match(r"^(\w+)\s+metrics http://([\d.]+:\d+)/metrics$", line):
                    endpoints[match.group(1)] = match.group(2)
                elif match := re.match(r"^(\w+)\s+[\d.]+:(\d+)\s+\(", line):
                    grpc_ports[match.group(1)] = int(match.group(2))
        async with open_channel(f"127.0.0.1:{grpc_ports['reconstructor']}", auth_token=token) as channel:
            with pytest.raises(grpc.aio.AioRpcError):
                await rpb_grpc.ReconstructorServiceStub(channel).Reconstruct(rpb.ReconstructRequest(), timeout=30)
        host, port = endpoints["reconstructor"].rsplit(":", 1)
        got = await asyncio.to_thread(scrape, int(port), host)
        assert got.value("polar_reconstructor_reconstructions_total", status="error") == 1
        assert got.has("target_info", service_name="polar-reconstructor")
        host, port = endpoints["evaluator"].rsplit(":", 1)
        assert not (await asyncio.to_thread(scrape, int(port), host)).family_names()  # nothing evaluated yet
    finally:
        proc.send_signal(signal.SIGTERM)
        await proc.wait()
    assert set(endpoints) == {"reconstructor", "evaluator"}
