"""The main job's calls, as ``polar run`` makes them, through the real backends (``-m bench.default_model.main_job``).

README command 1 runs the ``paginate`` task: four pi sessions, one at a time, each making one call whose prompt is
the same ~1,540 tokens (pi's system prompt, its tools and the task), up to 128 tokens sampled. So the backend sees
one cold call, then three calls that can reuse its prefill. This bench makes exactly that sequence (a prompt of
``--prompt-tokens``, ``--calls`` calls, exactly ``--new-tokens`` sampled at temperature 1) through each backend in
the same run, and plain ``model.generate`` (float32, torch's default threads, no reuse) on the same prompt as the
baseline:

* ``transformers float16``: the previous default of ``polar run`` (its own thread default: cores - 1);
* ``llama_cpp``: the default now (``model_proxy.backends.llama_cpp``, the wheel's Q4_1 GGUF; cores - 1 threads,
  every core while a look finds them idle);
* ``llama_cpp threads=N``: the same on every core (``--all-cores``), for a machine that does nothing else.

Prints per backend the first call, the mean of the later ones, the sum over all calls and the ratios against
``generate`` (a call of ``generate`` costs the same each time: it reuses nothing).
``[--prompt-tokens 1540] [--new-tokens 128] [--calls 4] [--generate-calls 2] [--all-cores]``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
from typing import Any

from bench.default_model.__main__ import Timings, build_prompt, plain_generate, sample
from model_proxy.backends import llama_cpp_missing


def _run(loop: asyncio.AbstractEventLoop, backend: Any, name: str, prompt: list[int], args: Any, t: Timings) -> None:
    loop.run_until_complete(backend.start())
    try:
        for i in range(args.calls):
            t.measure(f"{name}#{i}", functools.partial(sample, loop, backend, prompt, args.new_tokens, i))
    finally:
        loop.run_until_complete(backend.close())


def main() -> None:
    """Run the calls and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-tokens", type=int, default=1540)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--calls", type=int, default=4, help="calls per backend (the first is cold)")
    parser.add_argument("--generate-calls", type=int, default=2)
    parser.add_argument("--all-cores", action="store_true", help="also llama_cpp with a thread per core")
    args = parser.parse_args()
    if why := llama_cpp_missing():
        parser.error(why)
    if args.calls < 2 or args.generate_calls < 1:
        parser.error("--calls must be at least 2 and --generate-calls at least 1")

    import torch

    from model_proxy.backends.llama_cpp import LlamaCppBackend
    from model_proxy.backends.transformers_backend import TransformersBackend
    from polar_core.default_model import load_smollm2, smollm2_gguf_path

    threads = torch.get_num_threads()
    tokenizer, model = load_smollm2()
    prompt = build_prompt(tokenizer, args.prompt_tokens)
    load = os.getloadavg()
    print(f"cores {os.cpu_count()}, prompt {len(prompt)} tokens, {args.new_tokens} new, load average {load[0]:.1f}")
    t = Timings()
    for i in range(args.generate_calls):
        t.measure(f"generate#{i}", functools.partial(plain_generate, model, prompt, args.new_tokens, threads, i))
    loop = asyncio.new_event_loop()
    rows: list[tuple[str, Any]] = [
        ("transformers float16", TransformersBackend(model, quantize="float16")),
        ("llama_cpp", LlamaCppBackend(smollm2_gguf_path())),
    ]
    if args.all_cores:
        cores = os.cpu_count() or 1
        rows.append((f"llama_cpp threads={cores}", LlamaCppBackend(smollm2_gguf_path(), threads=cores)))
    for name, backend in rows:
        _run(loop, backend, name, prompt, args, t)
    loop.close()
    load_end = os.getloadavg()

    gen = statistics.median(t.wall[f"generate#{i}"][0] for i in range(args.generate_calls))
    print(
        f"\nplain generate: {gen:.2f} s a call (median of {args.generate_calls}); load average {load_end[0]:.1f} at end"
    )
    header = f"{'backend':<26} {'call 1 s':>9} {'later s':>8} {'all s':>7} {'later gen/x':>12} {'all gen/x':>10}"
    print(header)
    print("-" * len(header))
    for name, _ in rows:
        walls = [t.wall[f"{name}#{i}"][0] for i in range(args.calls)]
        later = statistics.mean(walls[1:])
        total = sum(walls)
        print(
            f"{name:<26} {walls[0]:>9.2f} {later:>8.2f} {total:>7.2f} {gen / later:>11.2f}x "
            f"{gen * args.calls / total:>9.2f}x"
        )


if __name__ == "__main__":
    main()
