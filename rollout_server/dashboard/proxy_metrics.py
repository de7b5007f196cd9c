"""Model-call latency and tokens per second for the dashboard, read from the proxies' Prometheus endpoints.

Why this source: the rollout server's store holds session outcomes, not calls; the calls' timings live with the
proxies. Every proxy exports its call histograms on a Prometheus endpoint (the same one a fleet's Prometheus
scrapes), so the dashboard reads those, in the embedded stack and in a fleet alike, and only while someone
watches. Percentiles come from the buckets' increase over a sliding window (``window_s``, a minute by default,
as PromQL's ``rate(...[1m])``; all proxies and label sets summed), interpolated within a bucket as PromQL's
``histogram_quantile`` does; until a read is that old, the window starts at the first read, whose totals count.
A window, not the last interval between two reads: calls come in bursts (an agent's turn, then a tool), so the
last second is often empty and the tiles would flicker to "–" mid-run.

The metric names follow the OpenTelemetry ``gen_ai`` server conventions; the first name of each list found is
used, so an endpoint exporting the ``polar_proxy_*`` names works too.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["DURATION_METRICS", "OUTPUT_TOKEN_METRICS", "TTFT_METRICS", "ProxyMetricsSource", "quantile"]

DURATION_METRICS = ("gen_ai_server_request_duration_seconds", "polar_proxy_call_duration_seconds")
TTFT_METRICS = ("gen_ai_server_time_to_first_token_seconds", "polar_proxy_time_to_first_token_seconds")
# A counter of sampled tokens (``_total`` stripped), or the token-usage histogram's sum of output tokens.
OUTPUT_TOKEN_METRICS = ("gen_ai_server_output_tokens", "polar_proxy_response_tokens", "gen_ai_client_token_usage")
_QUANTILES = (0.5, 0.9, 0.99)
_TIMEOUT_S = 2.0
DEFAULT_WINDOW_S = 60.0
_MAX_READINGS = 4096


@dataclasses.dataclass(slots=True)
class _Reading:
    at: float
    buckets: dict[str, dict[float, float]]  # metric -> upper bound -> cumulative count
    tokens: float | None


def quantile(q: float, buckets: dict[float, float]) -> float | None:
    """The ``q`` quantile of a cumulative histogram ``{upper bound: count}`` (``None`` when it is empty)."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower  # beyond the last finite bucket: its bound is the best we know
            return lower + (bound - lower) * ((rank - below) / (count - below) if count > below else 1.0)
        lower, below = bound, count
    return lower


def _parse(text: str, reading: _Reading) -> None:
    """Add one endpoint's histograms and output-token total into ``reading``.

    An endpoint read counts as zero output tokens until it exports the series (it does from its first call on), so
    a window that starts before the first call still gives a rate.
    """
    reading.tokens = reading.tokens or 0.0
    for family in text_string_to_metric_families(text):
        if family.name in (*DURATION_METRICS, *TTFT_METRICS):
            target = reading.buckets.setdefault(family.name, {})
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    bound = float(sample.labels["le"])
                    target[bound] = target.get(bound, 0.0) + float(sample.value)
        elif family.name.removesuffix("_total") in OUTPUT_TOKEN_METRICS:
            for sample in family.samples:
                output = sample.labels.get("gen_ai_token_type", "output") == "output"
                total = (
                    sample.name.endswith("_sum")
                    if family.type == "histogram"
                    else sample.name != family.name + "_created"
                )
                if output and total:
                    reading.tokens = (reading.tokens or 0.0) + float(sample.value)


def _delta(new: dict[float, float], old: dict[float, float] | None) -> dict[float, float]:
    if not old:
        return new
    delta = {b: new[b] - old.get(b, 0.0) for b in new}
    return delta if all(v >= 0 for v in delta.values()) else new  # a proxy restarted: use the totals


def _first(names: Sequence[str], buckets: dict[str, dict[float, float]]) -> str | None:
    return next((n for n in names if n in buckets), None)


class ProxyMetricsSource:
    """Reads the proxies' endpoints and turns the increase over a sliding window into percentiles and tokens/s.

    Args:
        urls: The proxies' Prometheus endpoints.
        window_s: How far back the figures reach: the window starts at the newest earlier read at least this old
            (or the oldest read kept, while none is).
        token: Bearer token the endpoints require (their ``metrics_token``); empty: none sent.
        clock: Monotonic time source.
    """

    def __init__(
        self,
        urls: Iterable[str],
        *,
        window_s: float = DEFAULT_WINDOW_S,
        token: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be positive, got {window_s}")
        self.urls = tuple(urls)
        self.window_s = window_s
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._trimmed = False  # whether the window has dropped a read (it starts at a read, not at zero)
        self._clock = clock
        self._readings: deque[_Reading] = deque(maxlen=_MAX_READINGS)  # bounds memory at tiny intervals
        self._http: aiohttp.ClientSession | None = None

    async def _fetch(self, url: str) -> str:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_TIMEOUT_S))
        async with self._http.get(url, headers=self._headers) as response:
            response.raise_for_status()
            return await response.text()

    async def read(self) -> dict[str, Any]:
        """The latest figures: ``{"source", "errors", "latency_s", "ttft_s", "tokens_per_s"}``."""
        if not self.urls:
            return {
                "source": "",
                "errors": [],
                "window_s": self.window_s,
                "latency_s": None,
                "ttft_s": None,
                "tokens_per_s": None,
            }
        reading = _Reading(self._clock(), {}, None)
        errors = []
        for url in self.urls:
            try:
                _parse(await self._fetch(url), reading)
            except aiohttp.ClientResponseError as exc:
                errors.append(
                    f"{url}: HTTP {exc.status}" + (" (set dashboard_proxy_metrics_token)" if exc.status == 401 else "")
                )
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                errors.append(f"{url}: {type(exc).__name__}")
        return self.figures(reading, errors)

    def figures(self, reading: _Reading, errors: list[str]) -> dict[str, Any]:
        """Turn ``reading`` (against the window's first read) into the dashboard's figures, and keep it."""
        kept = self._readings
        while len(kept) >= 2 and kept[1].at <= reading.at - self.window_s:
            kept.popleft()  # the next one is old enough to start the window
            self._trimmed = True
        if len(kept) == kept.maxlen:
            self._trimmed = True
        last = kept[0] if kept else None
        kept.append(reading)
        # Until the window has moved past the first read, it reaches back to the start: the totals count (the calls
        # made before the first read, and so before anyone watched, are in it).
        base = last if self._trimmed else None
        out: dict[str, Any] = {
            "source": ", ".join(self.urls),
            "errors": errors,
            "window_s": self.window_s,
            "tokens_per_s": None,
        }
        for key, names in (("latency_s", DURATION_METRICS), ("ttft_s", TTFT_METRICS)):
            name = _first(names, reading.buckets)
            if name is None:
                out[key] = None
                continue
            window = _delta(reading.buckets[name], base.buckets.get(name) if base else None)
            out[key] = {f"p{round(q * 100)}": quantile(q, window) for q in _QUANTILES}
        if last is not None and reading.tokens is not None and last.tokens is not None and reading.at > last.at:
            out["tokens_per_s"] = max(0.0, reading.tokens - last.tokens) / (reading.at - last.at)
        return out

    @classmethod
    def parse_for_test(cls, texts: Sequence[str], at: float) -> _Reading:
        """A reading of endpoint bodies ``texts`` taken at ``at`` (unit tests feed :meth:`figures` with it)."""
        reading = _Reading(at, {}, None)
        for text in texts:
            _parse(text, reading)
        return reading

    async def close(self) -> None:
        """Close the HTTP client."""
        if self._http is not None:
            await self._http.close()
            self._http = None
