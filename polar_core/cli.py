"""The ``polar`` command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from polar_core.errors import PolarError
from polar_core.services import SERVICE_NAMES, service_spec
from polar_core.tracing import create_tracer_provider

__all__ = ["main"]

# Subcommands contributed by service packages: each module has ``add_parser(subparsers)`` setting ``func``.
_EXTENSIONS = ("reconstructor.cli", "rollout_server.cli")


async def _check_health(port: int, service: str) -> bool:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


async def _serve(args: argparse.Namespace) -> int:
    names = [args.service] if args.service else list(SERVICE_NAMES)
    state_root = Path(args.state_dir)
    started: list[tuple[str, grpc.aio.Server, int, str]] = []
    try:
        for name in names:
            spec = service_spec(name)
            overrides: dict[str, object] = {"state_dir": state_root / name if len(names) > 1 else state_root}
            if args.host is not None:
                overrides["host"] = args.host
            if args.port is not None and len(names) == 1:
                overrides["port"] = args.port
            settings = spec.settings_cls.load(Path(args.config) if args.config else None, **overrides)
            server, port = await spec.start(settings, create_tracer_provider(name))
            started.append((name, server, port, spec.grpc_service))
            print(f"{name:<14} {settings.host}:{port}  ({spec.grpc_service})", flush=True)
        if args.check:
            ok = True
            for name, _, port, service in started:
                healthy = await _check_health(port, service)
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
        await asyncio.gather(*(server.stop(5) for _, server, _, _ in started))


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="polar", description="Polar: agentic RL rollouts in real harnesses.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run one service, or all five in one process")
    serve.add_argument("service", nargs="?", choices=SERVICE_NAMES, help="the service to run (default: all)")
    serve.add_argument("--config", help="TOML settings file ([proxy], [gateway], ... tables)")
    serve.add_argument("--state-dir", default=".polar", help="directory for durable state (default .polar)")
    serve.add_argument("--host", default=None, help="interface to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port for a single service (default: free port)")
    serve.add_argument("--check", action="store_true", help="start, check every service's health, and exit")
    serve.set_defaults(func=lambda a: asyncio.run(_serve(a)))
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
