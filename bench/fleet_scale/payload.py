"""Result payloads of real size for simulated sessions: one merged trace, or a 60-call trace set of several MB.

A session's traces follow the trace contract (``docs`` contracts: prompt and response token ids, a loss mask and
behaviour log-probabilities). A typical result is one prefix-merged trace of a multi-call session; a "large"
result is what per-request reconstruction of a 60-call session gives: 60 traces whose prompts grow call by
call, which is several MB on the wire. The traces are built once per gateway process and shared by its results
(only the result's envelope changes per session), so the gateways spend their CPU on gRPC, not on building data.
"""

from __future__ import annotations

import random

from polar.common.v1 import trace_pb2

__all__ = ["large_traces", "small_traces", "traces_bytes"]


def _trace(rng: random.Random, index: int, prompt: int, response: int) -> trace_pb2.Trace:
    # Token ids over a 150k vocabulary (3-byte varints), as a real tokenizer's ids are.
    mask = [1 if (i // 64) % 4 else 0 for i in range(response)]
    return trace_pb2.Trace(
        trace_index=index,
        call_ids=[f"call-{index}"],
        prompt_token_ids=[rng.randrange(20_000, 150_000) for _ in range(prompt)],
        response_token_ids=[rng.randrange(20_000, 150_000) for _ in range(response)],
        loss_mask=mask,
        response_logprobs=[-rng.random() if m else 0.0 for m in mask],
        reward=1.0,
        weight=1.0,
        status="resolved",
        exact_context=True,
        policy_versions=["0"],
    )


def small_traces(response_tokens: int, seed: int = 0) -> list[trace_pb2.Trace]:
    """One merged trace: a 2,000-token prompt and ``response_tokens`` tokens after it (0: a 2-token stub)."""
    rng = random.Random(seed)
    if response_tokens <= 0:
        return [_trace(rng, 0, 3, 2)]
    return [_trace(rng, 0, 2_000, response_tokens)]


def large_traces(calls: int = 60, seed: int = 1) -> list[trace_pb2.Trace]:
    """A per-request trace set of ``calls`` calls: call ``i`` has a prompt of 2,000 + 500 * i tokens, 300 sampled."""
    rng = random.Random(seed)
    return [_trace(rng, i, 2_000 + 500 * i, 300) for i in range(calls)]


def traces_bytes(traces: list[trace_pb2.Trace]) -> int:
    """Serialized size of ``traces`` inside a result."""
    return sum(t.ByteSize() + 4 for t in traces)
