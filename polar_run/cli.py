"""The ``polar`` command line: ``serve`` and ``health`` here, ``submit``/``status``/``run``/``generate`` in
:mod:`polar_run.commands`, and subcommands contributed by service packages (``reconstructor.cli``)."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from polar_core.errors import PolarError
from polar_run import commands
from polar_run.serve import SERVICE_NAMES, ServeOptions
from polar_run.serve import serve as serve_command

__all__ = ["main"]

# Subcommands contributed by service packages: each module has ``add_parser(subparsers)`` setting ``func``.
_EXTENSIONS = ("reconstructor.cli", "polar_train.cli", "polar_run.cluster.cli", "polar_run.tokens")


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


def _serve_options(args: argparse.Namespace) -> ServeOptions:
    return ServeOptions(
        services=tuple(args.services),
        config=Path(args.config) if args.config else None,
        state_dir=Path(args.state_dir) if args.state_dir is not None else None,
        host=args.host,
        port=args.port,
        check=args.check,
        insecure=args.insecure,
    )


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
    serve.add_argument(
        "--insecure",
        action="store_true",
        help="allow listening on a non-loopback address with no token and no mTLS (anyone who can reach the "
        "port controls the service); tokens come from POLAR_<SVC>_*_TOKEN variables or --config, never flags",
    )
    serve.set_defaults(func=lambda a: asyncio.run(serve_command(_serve_options(a))))
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
    commands.add_parser(sub)
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
