"""Benchmark reconstruction: strategies on long synthetic agent sessions, and the numpy prefix path versus a
pure-Python baseline of the same prefix-merge rule, measured in the same run.

Run: ``.venv/bin/python -m bench.reconstruct [--sessions N] [--turns N] [--repeat N]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from polar_core.records import CompletionRecord, ReconstructionStrategy, write_jsonl
from reconstructor import ReconstructionOptions, ReconstructionResult, reconstruct
from reconstructor.export import write_parquet
from reconstructor.synthetic import IM_END, SyntheticSpec, synthetic_session

T = TypeVar("T")


def naive_prefix_merge(records: Sequence[CompletionRecord], eot: int) -> list[list[str]]:
    """The same chain assignment with Python lists (slice copies, list.index): the baseline."""
    by_session: dict[str, list[CompletionRecord]] = {}
    for r in records:
        by_session.setdefault(r.session_id, []).append(r)
    groups: list[list[str]] = []
    for recs in by_session.values():
        chains: list[tuple[list[CompletionRecord], list[int]]] = []  # (calls, context)
        for r in sorted(recs, key=lambda x: x.seq):
            p = r.prompt_token_ids
            best = None
            for calls, context in chains:
                last = calls[-1].prompt_token_ids
                if len(last) >= len(p) or p[: len(last)] != last:
                    continue
                tail = p[len(last) :]
                if eot not in tail:
                    continue
                exact = p[: len(context)] == context
                key = (exact, len(last))
                if best is None or key > best[0]:
                    best = (key, calls, context, tail)
            if best is None:
                chains.append(([r], [*p, *r.response_token_ids]))
                continue
            _, calls, context, tail = best
            k = tail.index(eot)
            prev = calls[-1].response_token_ids
            inter = tail[k + 1 :] if prev and prev[-1] == eot else tail[k:]
            context.extend(inter)
            context.extend(r.response_token_ids)
            calls.append(r)
        groups += [[c.call_id for c in calls] for calls, _ in chains]
    return groups


def _best_of(fn: Callable[[], T], repeat: int) -> tuple[float, T]:
    best, out = float("inf"), fn()
    for _ in range(max(repeat, 1)):  # after one untimed warm-up run
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.reconstruct")
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    spec = SyntheticSpec(
        turns=args.turns,
        system_tokens=2000,
        response_tokens=200,
        tool_tokens=800,
        retokenize_prob=0.05,
        truncate_prob=0.05,
        compaction_every=40,
        subagents=3,
        subagent_turns=12,
    )
    rng = random.Random(0)
    records = [r for s in range(args.sessions) for r in synthetic_session(rng, spec, f"s{s}")]
    prompt_tokens = sum(len(r.prompt_token_ids) for r in records)
    print(
        f"workload: {args.sessions} sessions, {len(records)} calls, "
        f"{prompt_tokens / len(records):,.0f} prompt tokens per call on average, "
        f"longest prompt {max(len(r.prompt_token_ids) for r in records):,}"
    )

    rows = []
    results: dict[ReconstructionStrategy, ReconstructionResult] = {}
    for strategy in ReconstructionStrategy:
        options = ReconstructionOptions(strategy=strategy, end_of_turn_ids=(IM_END,))
        seconds, result = _best_of(functools.partial(reconstruct, records, options), args.repeat)
        assert isinstance(result, ReconstructionResult)
        results[strategy] = result
        rows.append((strategy.value, seconds, result))
    base_tokens = results[ReconstructionStrategy.PER_REQUEST].stats.total_tokens
    base_traces = results[ReconstructionStrategy.PER_REQUEST].stats.chains

    print()
    print(
        f"{'strategy':<13} {'time ms':>9} {'traces':>7} {'traces/per-req':>15} {'trainer tokens':>15} "
        f"{'tokens/per-req':>15} {'trainable':>10} {'inexact ctx tok':>16}"
    )
    for name, seconds, result in rows:
        st = result.stats
        print(
            f"{name:<13} {seconds * 1e3:>9.1f} {st.chains:>7} {st.chains / base_traces:>15.3f} "
            f"{st.total_tokens:>15,} {st.total_tokens / base_tokens:>15.3f} {st.trainable_tokens:>10,} "
            f"{st.mismatched_context_tokens / st.trainable_tokens:>15.2%}"
        )

    merged = results[ReconstructionStrategy.PREFIX_MERGE]
    print()
    print("prefix-merge chain assignment, numpy (this package, end to end) vs pure-Python lists (baseline):")
    print(f"{'workload':<40} {'chains/session':>15} {'baseline ms':>12} {'numpy ms':>9} {'ratio':>6}")
    for label, subagents in (
        ("4 threads per session", 3),
        ("17 threads per session", 16),
        ("33 threads per session", 32),
    ):
        wl_spec = dataclasses.replace(spec, subagents=subagents, compaction_every=0)
        wl_rng = random.Random(1)
        wl = [r for s in range(max(args.sessions // 4, 1)) for r in synthetic_session(wl_rng, wl_spec, f"w{s}")]
        options = ReconstructionOptions(end_of_turn_ids=(IM_END,))
        vec_s, vec = _best_of(functools.partial(reconstruct, wl, options), args.repeat)
        naive_s, groups = _best_of(functools.partial(naive_prefix_merge, wl, IM_END), args.repeat)
        assert isinstance(vec, ReconstructionResult)
        assert sorted(tuple(g) for g in groups) == sorted(tuple(t.call_ids) for t in vec.traces), "disagree"
        per_session = vec.stats.chains / max(args.sessions // 4, 1)
        print(f"{label:<40} {per_session:>15.1f} {naive_s * 1e3:>12.1f} {vec_s * 1e3:>9.1f} {vec_s / naive_s:>6.2f}")

    with tempfile.TemporaryDirectory() as tmp:
        jsonl, parquet = Path(tmp) / "traces.jsonl", Path(tmp) / "traces.parquet"
        js, _ = _best_of(lambda: write_jsonl(jsonl, (t.to_dict() for t in merged.traces)), args.repeat)
        pq_s, _ = _best_of(lambda: write_parquet(merged.traces, parquet), args.repeat)
        print()
        print(f"{'export (prefix-merge traces)':<34} {'time ms':>9} {'MB':>8} {'size ratio':>11}")
        jb, pb = jsonl.stat().st_size, parquet.stat().st_size
        print(f"{'traces.jsonl (baseline)':<34} {js * 1e3:>9.1f} {jb / 1e6:>8.2f} {1.0:>11.3f}")
        print(f"{'traces.parquet (zstd)':<34} {pq_s * 1e3:>9.1f} {pb / 1e6:>8.2f} {pb / jb:>11.3f}")
    print()
    print("stats (prefix-merge):", json.dumps(merged.stats.to_dict()))


if __name__ == "__main__":
    main()
