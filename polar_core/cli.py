"""The ``polar`` command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import secrets
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from polar_core.errors import PolarError
from polar_core.services import SERVICE_NAMES, service_spec
from polar_core.settings import ServiceSettings
from polar_core.tracing import create_tracer_provider

__all__ = ["main"]

# Subcommands contributed by service packages: each module has ``add_parser(subparsers)`` setting ``func``.
_EXTENSIONS = ("reconstructor.cli", "rollout_server.cli", "polar_train.cli")


async def _check_health(host: str, port: int, service: str) -> bool:
    target = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    async with grpc.aio.insecure_channel(f"{target}:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


# Start order for several services in one process: the gateway is wired to the services started before it.
_START_ORDER = ("proxy", "reconstructor", "evaluator", "rollout", "gateway")


async def _serve(args: argparse.Namespace) -> int:
    requested = list(dict.fromkeys(args.services)) or list(SERVICE_NAMES)
    for name in requested:
        service_spec(name)  # unknown names fail before anything starts
    names = sorted(requested, key=_START_ORDER.index)
    config = Path(args.config) if args.config else None
    # Services sharing a process share a control-plane token; the embedded default makes its own.
    token = secrets.token_urlsafe(24) if len(names) > 1 else ""
    addresses: dict[str, str] = {}
    started: list[tuple[str, grpc.aio.Server, str, int, str]] = []
    try:
        for name in names:
            spec = service_spec(name)
            overrides: dict[str, object] = {"host": args.host}
            if args.state_dir is not None:
                # Several services in one process each get their own folder under the given one.
                overrides["state_dir"] = Path(args.state_dir) / name if len(names) > 1 else Path(args.state_dir)
            if args.port is not None and len(names) == 1:
                overrides["port"] = args.port
            settings = spec.settings_cls.load(config, **overrides)
            wiring = _wiring(name, settings, addresses, token)
            if wiring:
                settings = spec.settings_cls.load(config, **overrides, **wiring)
            server, port = await spec.start(settings, create_tracer_provider(name))
            started.append((name, server, settings.host, port, spec.grpc_service))
            addresses[name] = f"{'127.0.0.1' if settings.host in ('0.0.0.0', '::') else settings.host}:{port}"
            print(f"{name:<14} {settings.host}:{port}  ({spec.grpc_service})", flush=True)
        if token:
            print(f"control-plane token: {token}", flush=True)
        if args.check:
            ok = True
            for name, _, host, port, service in started:
                healthy = await _check_health(host, port, service)
                ok &= healthy
                print(f"health {name:<14} {'SERVING' if healthy else 'NOT SERVING'}", flush=True)
            print("all services healthy" if ok else "some services are unhealthy", flush=True)
            return 0 if ok else 1
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        return 0
    finally:
        await asyncio.gather(*(server.stop(5) for _, server, _, _, _ in started))


def _wiring(name: str, settings: ServiceSettings, addresses: dict[str, str], token: str) -> dict[str, object]:
    """Settings that connect ``name`` to the services already started in this process (unset ones only)."""
    wiring: dict[str, object] = {}
    if token and not settings.auth_token:
        wiring["auth_token"] = token
    if name == "gateway":
        for peer in ("proxy", "reconstructor", "evaluator", "rollout"):
            if peer in addresses and not getattr(settings, f"{peer}_address", "x"):
                wiring[f"{peer}_address"] = addresses[peer]
    return wiring


async def _health(args: argparse.Namespace) -> int:
    async with grpc.aio.insecure_channel(args.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=args.service), timeout=5)
        except grpc.aio.AioRpcError as exc:
            print(f"{args.address}: {exc.code().name} {exc.details()}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{args.address}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="polar", description="Polar: agentic RL rollouts in real harnesses.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run one service, or all five in one process")
    serve.add_argument(
        "services",
        nargs="*",
        metavar="SERVICE",
        help=f"services to run in this process: {', '.join(SERVICE_NAMES)} (default: all five)",
    )
    serve.add_argument("--config", help="TOML settings file ([proxy], [gateway], ... tables)")
    serve.add_argument(
        "--state-dir", default=None, help="directory for durable state (default: each service's setting, .polar)"
    )
    serve.add_argument("--host", default=None, help="interface to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port for a single service (default: free port)")
    serve.add_argument("--check", action="store_true", help="start, check every service's health, and exit")
    serve.set_defaults(func=lambda a: asyncio.run(_serve(a)))
    health = sub.add_parser("health", help="check a service's gRPC health (exit 0 when SERVING)")
    health.add_argument("address", help="HOST:PORT of the service")
    health.add_argument("--service", default="", help="gRPC service name to check (default: the server)")
    health.set_defaults(func=lambda a: asyncio.run(_health(a)))
    for module_name in _EXTENSIONS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``polar`` command."""
    args = _build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        code = args.func(args)
    except PolarError as exc:
        print(f"polar: error: {exc.message}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    sys.exit(int(code or 0))
