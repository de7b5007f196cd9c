"""Direct calls to the benchmark's Triton server: the floor of the Triton hop, as the raw HTTP client is the stub's.

Each request is serialised once, ahead of time (the inputs the ``triton`` backend sends for a prompt of that
length), and sent as bytes on one gRPC channel with no deserialisation of the answer, so the time measured is
the server's and the transport's, not a client library's.
"""

from __future__ import annotations

import time

import grpc

from model_proxy.backends.triton import TritonBackend
from model_proxy.models import GenerationRequest, SamplingParams

__all__ = ["TritonDirect"]

_METHOD = "/inference.GRPCInferenceService/ModelInfer"


class TritonDirect:
    """One gRPC channel to Triton and pre-serialised ``ModelInfer`` requests."""

    def __init__(self, url: str, model: str, stop_id: int) -> None:
        self._url = url
        self._model = model
        self._stop_id = stop_id
        self._channel: grpc.aio.Channel | None = None
        self._requests: dict[int, bytes] = {}

    def _request(self, n_ids: int) -> bytes:
        """The serialised request for a prompt of ``n_ids`` IDs (what the backend would send)."""
        if n_ids not in self._requests:
            request = GenerationRequest(
                prompt_token_ids=tuple((i * 7919) % 100 for i in range(n_ids)),
                sampling=SamplingParams(max_tokens=64),
                stop_token_ids=(self._stop_id,),
                request_id="direct",
                stream=False,
            )
            self._requests[n_ids] = TritonBackend(self._url, self._model)._request_bytes(request)
        return self._requests[n_ids]

    async def timed(self, n_ids: int) -> float:
        """One call with an ``n_ids``-ID prompt; its round trip in ms."""
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self._url)
        call = self._channel.unary_unary(_METHOD, None, None)
        body = self._request(n_ids)
        start = time.perf_counter()
        answer = await call(body)
        elapsed = (time.perf_counter() - start) * 1000
        assert isinstance(answer, bytes)
        assert answer
        return elapsed

    async def latencies(self, n_ids: int, count: int) -> list[float]:
        """``count`` calls one after another."""
        return [await self.timed(n_ids) for _ in range(count)]

    async def close(self) -> None:
        """Close the channel."""
        if self._channel is not None:
            await self._channel.close(None)
            self._channel = None
