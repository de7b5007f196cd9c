"""Serve a Hugging Face causal LM on Triton (via PyTriton) with TensorRT-LLM's tensor names.

Runs in its own environment (``.venv-triton``, made by ``scripts/setup_backends.sh``): it imports only
PyTriton, numpy, torch and transformers, never this repository, so the script is run by path::

    .venv-triton/bin/python integration_tests/support/pytriton_server.py --model-dir DIR \\
        --grpc-port P --http-port Q --metrics-port R

Two models are bound: ``<name>`` (unary, like a non-decoupled ``tensorrt_llm`` model) and ``<name>_stream``
(decoupled: one response per sampled token when ``streaming`` is true, else one response). Like vLLM, and
unlike some TensorRT-LLM builds, the sampled end token is included in ``output_ids``. Log-probabilities are
``log_softmax(logits / temperature)`` of the sampled token, untruncated by top-k/top-p. The server prints
``READY`` on stdout once both models are loaded, and stops on SIGTERM or SIGINT.

With ``--scripted-ids IDS`` (a JSON list) instead of ``--model-dir``, no model is loaded: every call answers
those IDs at once, each with log-probability -0.1, cut at ``request_output_len`` (the benchmark's Triton hop,
``bench/proxy_overhead``).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig
from transformers import AutoModelForCausalLM, DynamicCache

_INPUTS = (
    Tensor(name="input_ids", dtype=np.int32, shape=(-1,)),
    Tensor(name="input_lengths", dtype=np.int32, shape=(1,)),
    Tensor(name="request_output_len", dtype=np.int32, shape=(1,)),
    Tensor(name="end_id", dtype=np.int32, shape=(1,), optional=True),
    Tensor(name="pad_id", dtype=np.int32, shape=(1,), optional=True),
    Tensor(name="stop_words_list", dtype=np.int32, shape=(2, -1), optional=True),
    Tensor(name="streaming", dtype=np.bool_, shape=(1,), optional=True),
    Tensor(name="return_log_probs", dtype=np.bool_, shape=(1,), optional=True),
    Tensor(name="temperature", dtype=np.float32, shape=(1,), optional=True),
    Tensor(name="runtime_top_k", dtype=np.int32, shape=(1,), optional=True),
    Tensor(name="runtime_top_p", dtype=np.float32, shape=(1,), optional=True),
    Tensor(name="random_seed", dtype=np.uint64, shape=(1,), optional=True),
)
_OUTPUTS = (
    Tensor(name="output_ids", dtype=np.int32, shape=(-1, -1)),
    Tensor(name="sequence_length", dtype=np.int32, shape=(-1,)),
    Tensor(name="output_log_probs", dtype=np.float32, shape=(-1, -1)),
    Tensor(name="cum_log_probs", dtype=np.float32, shape=(-1,)),
)


def _scalar(request: Any, name: str, default: Any) -> Any:
    if name not in request.data:
        return default
    return request.data[name].reshape(-1)[0].item()


def _stop_ids(request: Any) -> set[int]:
    stops: set[int] = set()
    end_id = _scalar(request, "end_id", -1)
    if end_id >= 0:
        stops.add(int(end_id))
    if "stop_words_list" in request.data:
        # TensorRT-LLM layout: [batch, 2, n]: flattened word IDs, then end offsets (-1 padded).
        words = request.data["stop_words_list"].reshape(2, -1)
        start = 0
        for offset in words[1]:
            if offset < 0:
                break
            if offset - start == 1:
                stops.add(int(words[0][start]))
            start = int(offset)
    return stops


class _Sampler:
    def __init__(self, model_dir: str) -> None:
        model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model = model.eval()
        self.lock = threading.Lock()

    def tokens(self, request: Any) -> Iterator[tuple[int, float]]:
        length = int(_scalar(request, "input_lengths", -1))
        prompt = request.data["input_ids"].reshape(-1)
        prompt = prompt[:length] if length >= 0 else prompt
        max_tokens = int(_scalar(request, "request_output_len", 16))
        temperature = float(_scalar(request, "temperature", 1.0))
        top_k = int(_scalar(request, "runtime_top_k", 0))
        top_p = float(_scalar(request, "runtime_top_p", 1.0))
        seed = _scalar(request, "random_seed", None)
        stops = _stop_ids(request)
        generator = torch.Generator()
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(int(seed))
        with self.lock, torch.inference_mode():
            inputs = torch.tensor([prompt.tolist()], dtype=torch.long)
            cache = DynamicCache(config=self.model.config)
            for _ in range(max_tokens):
                logits = self.model(input_ids=inputs, cache=cache, use_cache=True).logits[0, -1].float()
                scaled = logits if temperature == 0.0 else logits / temperature
                log_probs = torch.log_softmax(scaled, dim=-1)
                if temperature == 0.0:
                    token = int(torch.argmax(log_probs).item())
                else:
                    probs = log_probs.exp()
                    if 0 < top_k < probs.shape[-1]:
                        kth = torch.topk(probs, top_k).values[-1]
                        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
                    if top_p < 1.0:
                        ordered, order = torch.sort(probs, descending=True)
                        before = (torch.cumsum(ordered, -1) - ordered) / ordered.sum()
                        drop = torch.zeros_like(before, dtype=torch.bool).scatter(0, order, before >= top_p)
                        probs = torch.where(drop, torch.zeros_like(probs), probs)
                    token = int(torch.multinomial(probs, 1, generator=generator).item())
                yield token, float(log_probs[token].item())
                if token in stops:
                    return
                inputs = torch.tensor([[token]], dtype=torch.long)


def _response(ids: list[int], logprobs: list[float], cum: float) -> dict[str, np.ndarray]:
    return {
        "output_ids": np.array([[ids]], dtype=np.int32),
        "sequence_length": np.array([[len(ids)]], dtype=np.int32),
        "output_log_probs": np.array([[logprobs]], dtype=np.float32),
        "cum_log_probs": np.array([[cum]], dtype=np.float32),
    }


class _Scripted:
    """Answers fixed IDs at once (no model)."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def tokens(self, request: Any) -> Iterator[tuple[int, float]]:
        for token in self.ids[: int(_scalar(request, "request_output_len", len(self.ids)))]:
            yield token, -0.1


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model-dir")
    source.add_argument("--scripted-ids", help="a JSON list of IDs to answer every call with (no model)")
    parser.add_argument("--model-name", default="tiny")
    parser.add_argument("--grpc-port", type=int, required=True)
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--metrics-port", type=int, required=True)
    parser.add_argument("--workspace", default=None, help="PyTriton's work directory (default: a new one)")
    parser.add_argument("--triton-log", default=None, help="tritonserver's own log file (default: none)")
    args = parser.parse_args()
    # Diagnostics for a start that hangs: PyTriton's progress on stderr, every thread's stack on SIGUSR1.
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    sampler = _Scripted(json.loads(args.scripted_ids)) if args.scripted_ids else _Sampler(args.model_dir)

    def unary(requests: list[Any]) -> list[dict[str, np.ndarray]]:
        out = []
        for request in requests:
            pairs = list(sampler.tokens(request))
            lps = [lp for _, lp in pairs]
            out.append(_response([t for t, _ in pairs], lps, sum(lps)))
        return out

    def streaming(requests: list[Any]) -> Iterator[list[dict[str, np.ndarray]]]:
        (request,) = requests  # max_batch_size is 1 for the decoupled model
        if not bool(_scalar(request, "streaming", False)):
            yield unary(requests)
            return
        cum = 0.0
        for token, logprob in sampler.tokens(request):
            cum += logprob
            yield [_response([token], [logprob], cum)]

    config = TritonConfig(
        grpc_port=args.grpc_port,
        http_port=args.http_port,
        metrics_port=args.metrics_port,
        grpc_address="127.0.0.1",
        http_address="127.0.0.1",
        exit_on_error=True,
        log_file=args.triton_log,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with Triton(config=config, workspace=args.workspace) as triton:
        triton.bind(
            args.model_name,
            unary,
            inputs=_INPUTS,
            outputs=_OUTPUTS,
            config=ModelConfig(max_batch_size=4, batcher=DynamicBatcher()),
        )
        triton.bind(
            f"{args.model_name}_stream",
            streaming,
            inputs=_INPUTS,
            outputs=_OUTPUTS,
            config=ModelConfig(max_batch_size=1, decoupled=True),
        )
        triton.run()
        print("READY", flush=True)
        stop.wait()
    sys.exit(0)


if __name__ == "__main__":
    _main()
