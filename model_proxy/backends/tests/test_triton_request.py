"""The Triton backend's own ``ModelInfer`` serialisation carries exactly what tritonclient would have sent."""

from __future__ import annotations

import pytest
from tritonclient.grpc import _utils as triton_utils
from tritonclient.grpc import service_pb2

from model_proxy.backends.triton import TritonBackend, TritonTensorNames
from model_proxy.errors import MalformedRequest
from model_proxy.models import GenerationRequest, SamplingParams


def _request(sampling: SamplingParams, stops: tuple[int, ...] = (2,), prompt: tuple[int, ...] = (5, 17, 9)):
    return GenerationRequest(
        prompt_token_ids=prompt, sampling=sampling, stop_token_ids=stops, request_id="call-1", stream=False
    )


def _via_tritonclient(backend: TritonBackend, request: GenerationRequest) -> service_pb2.ModelInferRequest:
    """The request as ``tritonclient.grpc.aio``'s ``infer`` builds it from the backend's ``InferInput`` list."""
    message: service_pb2.ModelInferRequest = triton_utils._get_inference_request(
        model_name="tensorrt_llm",
        inputs=backend._inputs(request, streaming=False),
        model_version="",
        request_id=request.request_id,
        outputs=None,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=None,
        parameters=None,
    )
    return message


@pytest.mark.parametrize(
    ("sampling", "stops", "prompt"),
    [
        (SamplingParams(max_tokens=64), (2,), (5, 17, 9)),
        (SamplingParams(max_tokens=8, temperature=0.7, top_k=40, top_p=0.9, seed=123), (2, 7, 11), (1,)),
        (SamplingParams(max_tokens=1, temperature=0.0), (), tuple(range(35_000))),
        (SamplingParams(max_tokens=3, seed=0), (4, 5), (0, 2**31 - 1, -1)),
    ],
)
def test_request_bytes_equal_tritonclients_request(
    sampling: SamplingParams, stops: tuple[int, ...], prompt: tuple[int, ...]
) -> None:
    backend = TritonBackend("h:1", "tensorrt_llm", pad_id=3, tensor_names=TritonTensorNames(top_k="top_k"))
    request = _request(sampling, stops, prompt)
    for _ in range(2):  # the second time from the cached scalar part
        ours = service_pb2.ModelInferRequest.FromString(backend._request_bytes(request))
        assert ours == _via_tritonclient(backend, request)


def test_out_of_range_ids_are_malformed() -> None:
    backend = TritonBackend("h:1", "tensorrt_llm")
    with pytest.raises(MalformedRequest):
        backend._request_bytes(_request(SamplingParams(max_tokens=4), prompt=(2**31,)))
    with pytest.raises(MalformedRequest):
        backend._request_bytes(_request(SamplingParams(max_tokens=4), prompt=()))
    with pytest.raises(MalformedRequest):
        backend._request_bytes(_request(SamplingParams(max_tokens=None)))
