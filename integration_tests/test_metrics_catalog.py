"""Offline checks of the metric catalogue: every declared instrument exports the name it declares, the Grafana
dashboard's PromQL names only exported series and labels, and ``docs/observability.md`` lists every metric.

The scrape tests (``test_metrics_*.py``, ``test_gateway_service.py``) check the other direction on real services:
every family a service exports is declared here, with its type and label names.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from evaluator.metrics import EVALUATOR_METRICS
from gateway.metrics import GATEWAY_METRICS
from model_proxy.metrics import PROXY_METRICS
from polar_core.metrics import InstrumentKind, MetricSpec, make_instrument, prometheus_series
from reconstructor.metrics import RECONSTRUCTOR_METRICS
from rollout_server.metrics import ROLLOUT_METRICS

ROOT = Path(__file__).resolve().parents[1]
CATALOG: dict[str, tuple[MetricSpec, ...]] = {
    "gateway": GATEWAY_METRICS,
    "proxy": PROXY_METRICS,
    "rollout": ROLLOUT_METRICS,
    "reconstructor": RECONSTRUCTOR_METRICS,
    "evaluator": EVALUATOR_METRICS,
}
ALL_SPECS = tuple(spec for specs in CATALOG.values() for spec in specs)
_SCOPE_LABELS = {"otel_scope_name", "otel_scope_version", "otel_scope_schema_url"}
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}


def _export_one(spec: MetricSpec) -> tuple[str, str, set[str]]:
    """Record one value of ``spec`` with every declared label on a real exporter; return (family, type, labels)."""
    registry = CollectorRegistry()
    provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
    meter = provider.get_meter("catalog")
    attributes = {label: "x" for label in spec.labels}

    def observe(options: CallbackOptions) -> list[Observation]:
        return [Observation(1, attributes)]

    instrument: Any = make_instrument(meter, spec, observe if spec.kind is InstrumentKind.OBSERVABLE_GAUGE else None)
    if spec.kind in (InstrumentKind.COUNTER, InstrumentKind.UP_DOWN_COUNTER):
        instrument.add(1, attributes)
    elif spec.kind is InstrumentKind.HISTOGRAM:
        instrument.record(1, attributes)
    elif spec.kind is InstrumentKind.GAUGE:
        instrument.set(1, attributes)
    text = generate_latest(registry).decode()
    provider.shutdown()
    families = [f for f in text_string_to_metric_families(text) if f.name != "target_info"]
    assert len(families) == 1, text
    family = families[0]
    name = family.name + "_total" if family.type == "counter" else family.name
    labels = {k for s in family.samples for k in s.labels} - _SCOPE_LABELS - {"le"}
    return name, family.type, labels


@pytest.mark.parametrize("spec", ALL_SPECS, ids=lambda s: s.name)
def test_every_instrument_exports_the_name_type_and_labels_it_declares(spec: MetricSpec) -> None:
    name, kind, labels = _export_one(spec)
    assert (name, kind) == (spec.prometheus_name, spec.prometheus_type)
    assert labels == set(spec.prometheus_labels)


def test_no_two_services_declare_one_name() -> None:
    names = [spec.prometheus_name for spec in ALL_SPECS]
    assert len(names) == len(set(names))


def promql_names(expr: str) -> tuple[set[str], set[str]]:
    """The series names and the label names a PromQL expression uses."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    labels: set[str] = set()
    for matchers in re.findall(r"\{([^}]*)\}", expr):
        labels.update(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", matchers))
    expr = re.sub(r"\{[^}]*\}", "", expr)
    for clause in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", expr):
        labels.update(x.strip() for x in clause.split(",") if x.strip())
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = {
        m.group(0)
        for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*(?!\s*\()", expr)
        if m.group(0) not in _KEYWORDS and not re.fullmatch(r"[eE]\d*|Inf|NaN", m.group(0))
    }
    # An identifier directly followed by "(" is a function; the lookahead can stop one character short of it.
    names = {n for n in names if not re.search(rf"\b{re.escape(n)}\w*\s*\(", expr)}
    return names, labels


def test_the_promql_parser_finds_names_and_labels() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, stage) (rate(polar_x_seconds_bucket{a="b", c!~"d|e"}[$__rate_interval])))'
    )
    assert promql_names(expr) == ({"polar_x_seconds_bucket"}, {"le", "stage", "a", "c"})
    assert promql_names("sum(rate(a_total[5m])) / sum(rate(b_count[5m]))") == ({"a_total", "b_count"}, set())


def _dashboard_targets() -> list[tuple[str, str]]:
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "polar.json").read_text(encoding="utf-8"))
    targets = [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]
    assert targets
    return targets


def test_every_dashboard_query_names_only_exported_series_and_their_labels() -> None:
    exported = prometheus_series(ALL_SPECS)
    labels_of = {}
    for spec in ALL_SPECS:
        for series in prometheus_series([spec]):
            extra = {"le"} if series.endswith("_bucket") else set()
            labels_of[series] = set(spec.prometheus_labels) | extra
    used: set[str] = set()
    for title, expr in _dashboard_targets():
        names, labels = promql_names(expr)
        assert names, (title, expr)
        assert names <= exported, (title, names - exported)
        allowed = set().union(*(labels_of[n] for n in names))
        assert labels <= allowed, (title, labels - allowed)
        used |= names
    # Every service shows up on the dashboard.
    for service, specs in CATALOG.items():
        assert used & prometheus_series(specs), service


def test_the_dashboard_is_importable() -> None:
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "polar.json").read_text(encoding="utf-8"))
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
            assert panel["targets"], panel["title"]


def test_the_docs_list_every_metric() -> None:
    text = (ROOT / "docs" / "observability.md").read_text(encoding="utf-8")
    missing = [spec.prometheus_name for spec in ALL_SPECS if f"`{spec.prometheus_name}`" not in text]
    assert not missing


def test_every_polar_pod_carries_the_scrape_annotations_of_its_metrics_port() -> None:
    import tomllib

    import yaml

    config = yaml.safe_load((ROOT / "deploy" / "k8s" / "02-configmap.yaml").read_text(encoding="utf-8"))
    tables = tomllib.loads(config["data"]["polar.toml"])
    seen = set()
    for path in sorted((ROOT / "deploy" / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not doc or doc["kind"] != "Deployment":
                continue
            service = doc["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
            if service not in CATALOG:
                continue
            annotations = doc["spec"]["template"]["metadata"]["annotations"]
            port = int(annotations["prometheus.io/port"])
            assert annotations["prometheus.io/scrape"] == "true"
            assert annotations["prometheus.io/path"] == "/metrics"
            assert tables[service]["metrics_port"] == port
            assert tables[service]["metrics_host"] == "0.0.0.0"
            container_ports = {p["containerPort"] for c in doc["spec"]["template"]["spec"]["containers"]
                               for p in c["ports"]}  # fmt: skip
            assert port in container_ports, path.name
            seen.add(service)
    assert seen == set(CATALOG)
