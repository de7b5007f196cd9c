"""Scrape a Prometheus ``/metrics`` endpoint and look series up by name and labels (tests only)."""

from __future__ import annotations

import dataclasses
import urllib.request
from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families

from polar_core.metrics import MetricSpec

__all__ = ["Scrape", "scrape"]


@dataclasses.dataclass(frozen=True)
class Scrape:
    """One scrape: every sample as ``(series name, labels, value)`` and each family's declared type."""

    samples: tuple[tuple[str, dict[str, str], float], ...]
    types: dict[str, str]

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` whose labels include ``labels`` (0.0 when none match)."""
        return sum(v for n, ls, v in self.samples if n == name and all(ls.get(k) == w for k, w in labels.items()))

    def has(self, name: str, **labels: str) -> bool:
        """Whether any sample of ``name`` carries ``labels``."""
        return any(n == name and all(ls.get(k) == w for k, w in labels.items()) for n, ls, _ in self.samples)

    def family_names(self, prefixes: Iterable[str] = ("polar_", "gen_ai_")) -> set[str]:
        """The metric families exported under ``prefixes`` (Polar's own, not the exporter's ``target_info``)."""
        return {name for name in self.types if name.startswith(tuple(prefixes))}

    def check_declared(self, specs: Iterable[MetricSpec]) -> None:
        """Assert every exported family is declared in ``specs`` with the type and label names it has."""
        declared = {spec.prometheus_name: spec for spec in specs}
        for family in self.family_names():
            assert family in declared, f"{family} is exported but not declared"
            spec = declared[family]
            assert self.types[family] == spec.prometheus_type, (family, self.types[family])
            series = {family, f"{family}_bucket", f"{family}_sum", f"{family}_count"}
            for name, labels, _ in self.samples:
                if name in series:
                    extra = set(labels) - set(spec.prometheus_labels) - {"le", "otel_scope_name",
                                                                          "otel_scope_version",
                                                                          "otel_scope_schema_url"}  # fmt: skip
                    assert not extra, f"{name} carries undeclared labels {extra}"


def scrape(port: int, host: str = "127.0.0.1", *, token: str = "") -> Scrape:
    """GET ``http://host:port/metrics`` (with ``Authorization: Bearer token`` when given) and parse it."""
    request = urllib.request.Request(f"http://{host}:{port}/metrics")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    text = urllib.request.urlopen(request, timeout=10).read().decode()
    samples: list[tuple[str, dict[str, str], float]] = []
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        # The parser strips ``_total`` from counter family names; the series keep it.
        family_name = family.name + "_total" if family.type == "counter" else family.name
        types[family_name] = family.type
        samples.extend((s.name, dict(s.labels), float(s.value)) for s in family.samples)
    return Scrape(tuple(samples), types)
