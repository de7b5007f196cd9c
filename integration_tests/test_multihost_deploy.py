"""The deployment files (``deploy/``) agree with the code: offline checks, no Docker or cluster needed.

Compose and Kubernetes manifests are parsed; every ``POLAR_<SVC>_*`` variable must be a field of that service's
settings class and every ``OTEL_*`` one a :class:`TelemetrySettings` field, and each service's settings are
actually loaded from the manifest's environment (and the ConfigMap's TOML), so a renamed or retyped setting
fails here. Addresses must name a service that listens on that port; probes and health checks must hit the port
the service binds.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from evaluator.settings import EvaluatorSettings
from gateway.settings import GatewaySettings
from model_proxy.settings import ProxySettings
from polar_core.settings import ServiceSettings, TelemetrySettings
from polar_run.serve import SERVICE_NAMES
from reconstructor.settings import ReconstructorSettings
from rollout_server.settings import RolloutSettings

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
SETTINGS: dict[str, type[ServiceSettings]] = {
    "rollout": RolloutSettings,
    "gateway": GatewaySettings,
    "proxy": ProxySettings,
    "reconstructor": ReconstructorSettings,
    "evaluator": EvaluatorSettings,
}
# The role tokens each shipped service holds (docs/security.md): what it accepts, plus what it presents. No
# shipped service holds the legacy all-roles ``auth_token``.
ROLE_TOKENS: dict[str, set[str]] = {
    "rollout": {"trainer", "gateway", "internal", "admin"},
    "gateway": {"gateway", "internal"},
    "proxy": {"trainer", "gateway", "internal"},
    "reconstructor": {"gateway", "internal"},
    "evaluator": {"gateway"},
}
_ADDRESS = re.compile(r"(?<![\w.-])([a-z][a-z0-9-]*):(\d+)\b")
_SUBSTITUTION = re.compile(r"\$\{(\w+)(?:[:?-][^}]*)?\}")


def _env_prefix(cls: type[ServiceSettings]) -> str:
    return str(cls.model_config.get("env_prefix", ""))


def check_env_name(service: str, name: str) -> None:
    """``name`` must be a settings field of ``service`` (or a standard OpenTelemetry variable)."""
    if name.startswith("OTEL_"):
        assert name.lower() in TelemetrySettings.model_fields, f"{service}: {name} is no OpenTelemetry setting"
        return
    prefix = _env_prefix(SETTINGS[service])
    assert name.startswith(prefix), f"{service}: {name} lacks the prefix {prefix}"
    assert name[len(prefix) :].lower() in SETTINGS[service].model_fields, f"{service}: {name} is no setting"


def load_settings(
    monkeypatch: pytest.MonkeyPatch, service: str, env: Mapping[str, str], toml: Path | None = None
) -> ServiceSettings:
    """Load ``service``'s settings the way ``polar serve`` would, from exactly ``env`` (and ``toml``)."""
    with monkeypatch.context() as m:
        for key in list(os.environ):
            if key.startswith(("POLAR_", "OTEL_")):
                m.delenv(key)
        for key, value in env.items():
            m.setenv(key, value)
        return SETTINGS[service].load(toml)


def addresses(text: str) -> Iterator[tuple[str, int]]:
    """``(host, port)`` of every ``host:port`` with a bare (service) host name in ``text``."""
    for match in _ADDRESS.finditer(text):
        yield match.group(1), int(match.group(2))


def listening_ports(settings: ServiceSettings) -> set[int]:
    ports = {settings.port}
    for extra in ("http_port", "metrics_port"):
        value = getattr(settings, extra, None)
        if isinstance(value, int) and value > 0:
            ports.add(value)
    return ports


# Compose --------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return data


def _compose_env(service: Mapping[str, Any]) -> dict[str, str]:
    """The service's environment with ``${VAR...}`` substitutions replaced by a placeholder."""
    env = service.get("environment", {})
    assert isinstance(env, dict), "environment must be a mapping"
    return {k: _SUBSTITUTION.sub("placeholder", str(v)) for k, v in env.items()}


def test_compose_runs_every_service_with_valid_settings(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    services: dict[str, Any] = compose["services"]
    assert set(SERVICE_NAMES) <= set(services)
    assert {"postgres", "jaeger"} <= set(services)
    targets = set(re.findall(r"^FROM \S+ AS (\S+)$", (DEPLOY / "Dockerfile").read_text(), re.MULTILINE))
    ports: dict[str, set[int]] = {"postgres": {5432}, "jaeger": {4317, 4318, 16686}}
    for name in SERVICE_NAMES:
        service = services[name]
        assert service["build"]["target"] == name
        assert name in targets
        assert service["build"]["dockerfile"] == "deploy/Dockerfile"
        assert service["image"] == f"polar-{name}:latest"
        assert service["command"][0] == name, "the image's entrypoint is `polar serve`"
        assert "--state-dir" in service["command"]
        env = _compose_env(service)
        for key in env:
            check_env_name(name, key)
        settings = load_settings(monkeypatch, name, env)
        assert settings.host == "0.0.0.0"
        assert settings.auth_token == ""
        for role in ("trainer", "gateway", "internal", "admin"):
            key = f"{_env_prefix(SETTINGS[name])}{role.upper()}_TOKEN"
            if role in ROLE_TOKENS[name]:
                assert getattr(settings, f"{role}_token") == "placeholder", (name, role)
                assert str(service["environment"][key]).startswith(f"${{POLAR_{role.upper()}_TOKEN"), key
            else:
                assert key not in service["environment"], f"{name} holds the {role} token it does not need"
        assert TelemetrySettings.model_validate(
            {k.lower(): v for k, v in env.items() if k.startswith("OTEL_")}
        ).export_enabled
        test = service["healthcheck"]["test"]
        assert test[:3] == ["CMD", "python", "/opt/polar/deploy/healthcheck.py"]
        assert test[3] == f"127.0.0.1:{settings.port}"
        ports[name] = listening_ports(settings)
    for name, service in services.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on unknown service {dependency}"
        for host, port in addresses(json.dumps(service.get("environment", {}))):
            if host in services:
                assert port in ports[host], f"{name}: {host}:{port} but {host} listens on {sorted(ports[host])}"
    gateway = load_settings(monkeypatch, "gateway", _compose_env(services["gateway"]))
    assert isinstance(gateway, GatewaySettings)
    assert gateway.runtime_network == "proxy", "sandboxes must not get the host's network"
    for field in ("proxy_address", "reconstructor_address", "evaluator_address", "rollout_address"):
        assert getattr(gateway, field).split(":")[0] in services, field
    rollout = load_settings(monkeypatch, "rollout", _compose_env(services["rollout"]))
    assert isinstance(rollout, RolloutSettings)
    assert rollout.store_url.startswith("postgresql://")
    assert [a.split(":")[0] for a in rollout.gateway_addresses] == ["gateway"]


def test_compose_substitutions_are_defined_in_the_env_example(compose: dict[str, Any]) -> None:
    text = (DEPLOY / "compose.yaml").read_text()
    used = set(_SUBSTITUTION.findall(text))
    example = (DEPLOY / "polar.env.example").read_text()
    defined = {line.split("=", 1)[0] for line in example.splitlines() if "=" in line and not line.startswith("#")}
    assert used == {f"POLAR_{r}_TOKEN" for r in ("TRAINER", "GATEWAY", "INTERNAL", "ADMIN")} | {"POLAR_DB_PASSWORD"}
    assert used <= defined


def test_healthcheck_script_is_shipped_in_the_images() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    assert "COPY deploy/healthcheck.py ./deploy/healthcheck.py" in dockerfile
    assert "!deploy/healthcheck.py" in ignore
    assert 'ENTRYPOINT ["polar", "serve"]' in dockerfile


# Kubernetes -----------------------------------------------------------------------------------------------------
_KINDS = {"Namespace", "Secret", "ConfigMap", "Service", "Deployment", "StatefulSet", "DaemonSet"}
_WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet"}


@pytest.fixture(scope="module")
def manifests() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def _by_kind(docs: list[dict[str, Any]], *kinds: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in kinds]


def _pod_labels(workload: Mapping[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def _containers(workload: Mapping[str, Any]) -> list[dict[str, Any]]:
    containers: list[dict[str, Any]] = workload["spec"]["template"]["spec"]["containers"]
    return containers


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    files = {p.name for p in (DEPLOY / "k8s").glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


def test_manifests_are_well_formed(manifests: list[dict[str, Any]]) -> None:
    names: set[tuple[str, str]] = set()
    for doc in manifests:
        assert doc["kind"] in _KINDS, doc["kind"]
        assert doc["apiVersion"] == ("apps/v1" if doc["kind"] in _WORKLOADS else "v1")
        key = (doc["kind"], doc["metadata"]["name"])
        assert key not in names, f"duplicate {key}"
        names.add(key)
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "polar", key
    for workload in _by_kind(manifests, *_WORKLOADS):
        selector = workload["spec"]["selector"]["matchLabels"]
        assert selector.items() <= _pod_labels(workload).items(), workload["metadata"]["name"]
        volumes = {v["name"] for v in workload["spec"]["template"]["spec"].get("volumes", [])}
        claims = {c["metadata"]["name"] for c in workload["spec"].get("volumeClaimTemplates", [])}
        for container in _containers(workload):
            limits, requests = container["resources"]["limits"], container["resources"]["requests"]
            assert {"cpu", "memory"} <= set(limits), container["name"]
            assert {"cpu", "memory"} <= set(requests), container["name"]
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes | claims, mount["name"]
            assert "readinessProbe" in container, container["name"]
            assert "livenessProbe" in container, container["name"]


def test_services_select_a_workload_and_its_ports(manifests: list[dict[str, Any]]) -> None:
    workloads = _by_kind(manifests, *_WORKLOADS)
    for service in _by_kind(manifests, "Service"):
        selector = service["spec"]["selector"]
        matches = [w for w in workloads if selector.items() <= _pod_labels(w).items()]
        assert len(matches) == 1, f"Service {service['metadata']['name']} selects {len(matches)} workloads"
        container_ports = [p for c in _containers(matches[0]) for p in c.get("ports", [])]
        for port in service["spec"]["ports"]:
            target = port["targetPort"]
            assert any(target in (p.get("name"), p["containerPort"]) for p in container_ports), target
            named = next(p for p in container_ports if target in (p.get("name"), p["containerPort"]))
            assert port["port"] == named["containerPort"], "Service and container ports should agree"


def test_polar_containers_load_their_settings(
    manifests: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    secrets = {d["metadata"]["name"]: d for d in _by_kind(manifests, "Secret")}
    config_maps = {d["metadata"]["name"]: d for d in _by_kind(manifests, "ConfigMap")}
    service_ports = {
        s["metadata"]["name"]: {p["port"] for p in s["spec"]["ports"]} for s in _by_kind(manifests, "Service")
    }
    toml_path = tmp_path / "polar.toml"
    toml_path.write_text(config_maps["polar-config"]["data"]["polar.toml"])
    toml_data = tomllib.loads(toml_path.read_text())
    assert set(toml_data) <= set(SERVICE_NAMES)
    seen: set[str] = set()
    node_of: dict[str, str] = {}  # Service name -> the node its workload is pinned to
    proxies_of_gateways: list[tuple[str, str]] = []
    for workload in _by_kind(manifests, *_WORKLOADS):
        pod = workload["spec"]["template"]["spec"]
        for container in _containers(workload):
            if not container["image"].startswith("polar-"):
                continue
            name = container["args"][0]
            assert name in SERVICE_NAMES
            assert container["image"] == f"polar-{name}:latest"
            seen.add(name)
            args = container["args"]
            assert args[args.index("--config") + 1] == "/etc/polar/polar.toml"
            mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/etc/polar")
            volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
            assert volume["configMap"]["name"] in config_maps
            env: dict[str, str] = {}
            for item in container.get("env", []):
                check_env_name(name, item["name"])
                if "valueFrom" in item:
                    ref = item["valueFrom"]["secretKeyRef"]
                    env[item["name"]] = secrets[ref["name"]]["stringData"][ref["key"]]
                else:
                    env[item["name"]] = item["value"]
            settings = load_settings(monkeypatch, name, env, toml_path)
            assert settings.auth_token == "", f"{name} holds the all-roles token"
            for role in ("trainer", "gateway", "internal", "admin"):
                want = secrets["polar-secrets"]["stringData"][f"{role}-token"] if role in ROLE_TOKENS[name] else ""
                assert getattr(settings, f"{role}_token") == want, (name, role)
            container_ports = {p["containerPort"] for p in container["ports"]}
            assert listening_ports(settings) == container_ports, name
            for probe in ("readinessProbe", "livenessProbe"):
                assert container[probe]["grpc"]["port"] == settings.port, (name, probe)
            for host, port in addresses(json.dumps(env) + json.dumps(settings.model_dump(mode="json"))):
                if host in service_ports:
                    assert port in service_ports[host], f"{name}: {host}:{port}"
            selector = pod.get("nodeSelector", {})
            if "polar.dev/host" in selector:
                node_of[workload["metadata"]["name"]] = selector["polar.dev/host"]
            if isinstance(settings, GatewaySettings):
                assert settings.runtime_network == "proxy", "sandboxes must not get the host's network"
                assert pod.get("hostUsers") is False, "procMount: Unmasked needs the pod's own user namespace"
                assert container["securityContext"]["procMount"] == "Unmasked"
                for field in ("proxy_address", "reconstructor_address", "evaluator_address", "rollout_address"):
                    assert getattr(settings, field).split(":")[0] in service_ports, field
                proxies_of_gateways.append((workload["metadata"]["name"], settings.proxy_address.split(":")[0]))
            if isinstance(settings, RolloutSettings):
                assert settings.store_url.startswith("postgresql://")
                gateways = [a.split(":")[0] for a in settings.gateway_addresses]
                assert gateways
                assert all(g.startswith("gateway-") and g in service_ports for g in gateways)
    assert seen == set(SERVICE_NAMES)
    # Each gateway uses the proxy pinned to its own host.
    assert proxies_of_gateways
    for gateway, proxy in proxies_of_gateways:
        assert node_of[gateway] == node_of[proxy], (gateway, proxy)
