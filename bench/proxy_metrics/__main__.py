"""Measure what the proxy's metrics add to a call: the engine pipeline with and without them, and the recording.

Run: ``.venv/bin/python -m bench.proxy_metrics`` (``--calls N``, ``--rounds R``).

* **pipeline** -- one small Chat Completions call through the engine (parse, render, tokenise, gate, a scripted
  backend that answers at once, parse, the completion record with ``fsync`` off), in-process, no HTTP: the
  proxy's own per-call work, where the metrics' share is largest. Rounds alternate between the two
  configurations (metrics off: the no-op meter; on: the SDK meter with a Prometheus reader, as
  ``metrics_port`` >= 0 gives), so machine load drifts hit both alike; the medians of the rounds' per-call
  means are reported, and the fastest round's (least disturbed by other load).
* **recording** -- :meth:`~model_proxy.metrics.ProxyMetrics.call_finished` alone (the engine defers it to the
  event loop's next turn, after the answer is handed over; with metrics off nothing is recorded).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry

from model_proxy.app import ProxyApp
from model_proxy.backends.scripted import ScriptedBackend, ScriptTurn
from model_proxy.metrics import CallMeasurement, ProxyMetrics
from model_proxy.settings import ProxySettings
from polar_core.model_fixtures import build_tiny_tokenizer


def _sdk_metrics() -> ProxyMetrics:
    return ProxyMetrics(MeterProvider(metric_readers=[PrometheusMetricReader(registry=CollectorRegistry())]))


async def _calls(app: ProxyApp, n: int, session_id: str) -> float:
    """Mean seconds per call of ``n`` sequential calls in a fresh session."""
    session, _token = await app.registry.open(session_id, "policy")
    body = {"model": "policy", "messages": [{"role": "user", "content": "hello"}]}
    started = time.perf_counter()
    for _ in range(n):
        parsed = app.http.adapters["openai_chat"].parse(dict(body), path_model=None, path_stream=False)
        call = await app.engine.start_call(session, parsed.internal)
        await call.collect()
    return (time.perf_counter() - started) / n


async def _pipeline(calls: int, rounds: int) -> dict[str, float]:
    """Per-call seconds of each configuration: the fastest round (least disturbed) and the median round."""
    tok = build_tiny_tokenizer()
    eot: Any = tok.convert_tokens_to_ids("<|im_end|>")
    backend = ScriptedBackend([ScriptTurn(text="All done: 42.")] * calls, tok, end_of_turn_id=eot, chunk_size=64)
    with tempfile.TemporaryDirectory() as tmp:
        app = ProxyApp(ProxySettings(state_dir=Path(tmp), fsync=False), backend, tok)
        off, on = ProxyMetrics(NoOpMeterProvider()), _sdk_metrics()
        results: dict[str, list[float]] = {"off": [], "on": []}
        await _calls(app, calls, "warmup")
        gc.collect()
        gc.freeze()  # as the proxy does once started (``gc_freeze``): no collection rescans torch and the tokenizer
        for r in range(rounds):
            for name, metrics in (("off", off), ("on", on)) if r % 2 == 0 else (("on", on), ("off", off)):
                app.engine.metrics = metrics
                results[name].append(await _calls(app, calls, f"{name}-{r}"))
        await backend.close()
    return {f"{name} {how}": pick(values) for name, values in results.items()
            for how, pick in (("min", min), ("median", statistics.median))}  # fmt: skip


def _recording(n: int, repeat: int = 7) -> float:
    """Seconds of one finished call's recording on the SDK meter, best of ``repeat`` runs of ``n``."""
    metrics = _sdk_metrics()
    measured = CallMeasurement("openai_chat", "ok", 0.02, 0.01, 30, 8, 0.015, 0.01, 0.001, "scripted")
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(n):
            metrics.call_finished(measured)
        best = min(best, (time.perf_counter() - started) / n)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per round")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    pipeline = asyncio.run(_pipeline(args.calls, args.rounds))
    recording = _recording(2000)
    for how in ("min", "median"):
        off, on = pipeline[f"off {how}"], pipeline[f"on {how}"]
        print(f"pipeline per call ({how:>6} of {args.rounds} rounds): metrics off {off * 1e6:7.1f} us, "
              f"on {on * 1e6:7.1f} us, added {(on - off) * 1e6:+7.1f} us ({(on / off - 1) * 100:+.1f} %)")  # fmt: skip
    print(
        f"recording one call (metrics on, best of 7): {recording * 1e6:.1f} us of CPU, after the answer is handed over"
    )


if __name__ == "__main__":
    main()
