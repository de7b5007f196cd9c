"""The model proxy's Prometheus endpoint over real sockets: the official OpenAI SDK drives calls, then a scrape."""

from __future__ import annotations

import hashlib
import urllib.error
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest
from polar.proxy.v1 import model_proxy_service_pb2 as pb
from polar.proxy.v1 import model_proxy_service_pb2_grpc as pb_grpc

from integration_tests.support.prometheus import scrape
from model_proxy.backends.scripted import ScriptedBackend, ScriptTurn
from model_proxy.metrics import PROXY_METRICS
from model_proxy.server import start_server
from model_proxy.settings import ProxySettings
from polar_core.model_fixtures import build_tiny_tokenizer
from rollout_server.dashboard import ProxyMetricsSource


async def test_one_openai_call_is_counted_with_its_usage(tmp_path: Path) -> None:
    """After one chat call (and one refused call), the calls counter, token usage and latency series say so."""
    tok = build_tiny_tokenizer()
    eot: Any = tok.convert_tokens_to_ids("<|im_end|>")
    backend = ScriptedBackend([ScriptTurn(text="All done: 42.")], tok, end_of_turn_id=eot, chunk_size=3)
    settings = ProxySettings(state_dir=tmp_path, metrics_port=0, policy_version="7")
    running = await start_server(settings, backend=backend, tokenizer=tok)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
    try:
        stub = pb_grpc.ModelProxyServiceStub(channel)
        opened = await stub.OpenSession(pb.OpenSessionRequest(session_id="m", model="policy"))
        async with openai.AsyncOpenAI(
            base_url=opened.openai_base_url, api_key=opened.session_token, max_retries=0
        ) as client:
            reply = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
            async with openai.AsyncOpenAI(base_url=opened.openai_base_url, api_key="wrong", max_retries=0) as bad:
                try:
                    await bad.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
                except openai.AuthenticationError:
                    pass
                else:
                    raise AssertionError("a wrong key was accepted")
        usage = reply.usage
        assert usage is not None
        got = scrape(running.app.metrics_port)
    finally:
        await channel.close(None)
        await running.stop(None)
    assert got.value("polar_proxy_calls_total", protocol="openai_chat", status="ok") == 1
    assert got.value("polar_proxy_calls_total", protocol="openai_chat", status="error") == 1
    assert got.has("polar_proxy_calls_total", status="error", error_type="UnknownSession")
    tokens = "gen_ai_client_token_usage_sum"
    assert got.value(tokens, gen_ai_token_type="input", protocol="openai_chat") == usage.prompt_tokens
    assert got.value(tokens, gen_ai_token_type="output", protocol="openai_chat") == usage.completion_tokens
    assert got.value("gen_ai_server_time_to_first_token_seconds_count", protocol="openai_chat") == 1
    assert got.value("gen_ai_server_request_duration_seconds_count", protocol="openai_chat", status="ok") == 1
    assert got.value("gen_ai_server_request_duration_seconds_sum", status="ok") > 0
    assert got.value("gen_ai_client_operation_duration_seconds_count", backend=backend.name) == 1
    assert got.value("polar_proxy_record_write_duration_seconds_count") == 1
    assert got.value("gen_ai_server_time_per_output_token_seconds_count") == (1 if usage.completion_tokens > 1 else 0)
    assert got.value("polar_proxy_policy_version") == 7
    assert got.value("polar_proxy_calls_in_flight") == 0
    assert got.value("polar_proxy_generation_paused") == 0
    assert got.value("polar_proxy_calls_paused") == 0
    assert not got.has("polar_proxy_backend_errors_total")
    got.check_declared(PROXY_METRICS)


async def test_a_metrics_token_guards_the_endpoint_and_the_dashboard_presents_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``POLAR_PROXY_METRICS_TOKEN`` (here as a digest): a scrape without the token gets 401 and no series; the
    dashboard's reader with ``dashboard_proxy_metrics_token`` gets the figures, without it names the refusal."""
    token = "metrics-Secret-5"
    monkeypatch.setenv("POLAR_PROXY_METRICS_TOKEN", "sha256:" + hashlib.sha256(token.encode()).hexdigest())
    tok = build_tiny_tokenizer()
    eot: Any = tok.convert_tokens_to_ids("<|im_end|>")
    backend = ScriptedBackend([ScriptTurn(text="All done: 42.")], tok, end_of_turn_id=eot, chunk_size=3)
    settings = ProxySettings(state_dir=tmp_path, metrics_port=0)
    running = await start_server(settings, backend=backend, tokenizer=tok)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
    url = f"http://127.0.0.1:{running.app.metrics_port}/metrics"
    with_token = ProxyMetricsSource([url], token=token)
    without = ProxyMetricsSource([url])
    try:
        stub = pb_grpc.ModelProxyServiceStub(channel)
        opened = await stub.OpenSession(pb.OpenSessionRequest(session_id="m", model="policy"))
        await with_token.read()  # the window's start, before the call
        async with openai.AsyncOpenAI(
            base_url=opened.openai_base_url, api_key=opened.session_token, max_retries=0
        ) as client:
            await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(urllib.error.HTTPError) as refused:
            scrape(running.app.metrics_port)
        assert refused.value.code == 401
        assert b"gen_ai" not in refused.value.read()
        got = scrape(running.app.metrics_port, token=token)
        assert got.value("polar_proxy_calls_total", protocol="openai_chat", status="ok") == 1
        figures = await with_token.read()
        assert figures["errors"] == []
        assert figures["latency_s"]["p50"] is not None
        assert figures["tokens_per_s"] > 0
        blocked = await without.read()
        assert blocked["errors"] == [f"{url}: HTTP 401 (set dashboard_proxy_metrics_token)"]
        assert blocked["latency_s"] is None
    finally:
        await with_token.close()
        await without.close()
        await channel.close(None)
        await running.stop(None)
