"""The five services by name, loaded lazily so ``polar serve proxy`` imports only the proxy."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from opentelemetry.sdk.trace import TracerProvider

from polar_core.errors import InvalidArgument
from polar_core.settings import ServiceSettings

__all__ = ["SERVICE_NAMES", "ServiceSpec", "service_spec"]

SERVICE_NAMES = ("rollout", "gateway", "proxy", "reconstructor", "evaluator")

_MODULES = {
    "rollout": ("rollout_server", "RolloutSettings", "polar.rollout.v1.RolloutService"),
    "gateway": ("gateway", "GatewaySettings", "polar.gateway.v1.GatewayService"),
    "proxy": ("model_proxy", "ProxySettings", "polar.proxy.v1.ModelProxyService"),
    "reconstructor": ("reconstructor", "ReconstructorSettings", "polar.reconstructor.v1.ReconstructorService"),
    "evaluator": ("evaluator", "EvaluatorSettings", "polar.evaluator.v1.EvaluatorService"),
}

CreateServer = Callable[..., Awaitable[tuple[grpc.aio.Server, int]]]


@dataclasses.dataclass(frozen=True, slots=True)
class ServiceSpec:
    """How to configure and start one service."""

    name: str
    grpc_service: str
    settings_cls: type[ServiceSettings]
    create_server: CreateServer

    async def start(
        self, settings: ServiceSettings, tracer_provider: TracerProvider | None = None
    ) -> tuple[grpc.aio.Server, int]:
        """Start the service with ``settings``."""
        return await self.create_server(settings, tracer_provider=tracer_provider)


def service_spec(name: str) -> ServiceSpec:
    """Return the spec of service ``name`` (one of :data:`SERVICE_NAMES`)."""
    try:
        package, settings_name, grpc_service = _MODULES[name]
    except KeyError:
        raise InvalidArgument(f"unknown service {name!r}; choose from {', '.join(SERVICE_NAMES)}") from None
    settings_mod: Any = importlib.import_module(f"{package}.settings")
    server_mod: Any = importlib.import_module(f"{package}.server")
    return ServiceSpec(name, grpc_service, getattr(settings_mod, settings_name), server_mod.create_server)
