"""The model proxy in front of the tiny random Qwen2 model (transformers backend), driven by the SDKs."""

from __future__ import annotations

from pathlib import Path

import anthropic
import openai

from model_proxy.app import ProxyApp
from model_proxy.backends.transformers_backend import TransformersBackend
from model_proxy.settings import ProxySettings
from polar_core.model_fixtures import build_tiny_model, build_tiny_tokenizer


async def test_tiny_model_behind_the_proxy(tmp_path: Path) -> None:
    tok = build_tiny_tokenizer()
    backend = TransformersBackend(build_tiny_model(tok, seed=0), chunk_size=2)
    app = ProxyApp(ProxySettings(state_dir=tmp_path), backend, tok)
    await app.start()
    try:
        session, token = await app.registry.open("tiny", "policy")
        async with openai.AsyncOpenAI(base_url=f"{app.base_url}/v1", api_key=token, max_retries=0) as client:
            stream = await client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=12, stream=True
            )
            finish = [chunk.choices[0].finish_reason async for chunk in stream if chunk.choices]
            assert finish[-1] in ("stop", "length")
        async with anthropic.AsyncAnthropic(base_url=app.base_url, api_key=token, max_retries=0) as claude:
            message = await claude.messages.create(
                model="policy", max_tokens=12, messages=[{"role": "user", "content": "hi"}]
            )
            assert message.stop_reason in ("end_turn", "max_tokens", "tool_use")
            assert message.usage.output_tokens == len(session.records[1].response_token_ids)
        for record in session.records:
            assert 0 < len(record.response_token_ids) <= 12
            assert len(record.response_logprobs) == len(record.response_token_ids)
            assert all(lp <= 0.0 for lp in record.response_logprobs)
            assert record.extra["backend"] == "transformers"
        # Same prompt both times (template rendering is protocol-independent for a plain user turn).
        assert session.records[0].prompt_token_ids == session.records[1].prompt_token_ids
    finally:
        await app.close()
