"""Exit 0 when a Polar service answers the standard gRPC health check with SERVING, else 1.

Used by container health checks (``python /opt/polar/deploy/healthcheck.py 127.0.0.1:50051``). Health checks
need no control-plane token. With mutual TLS on, give the client certificate, key and CA with ``--cert``,
``--key`` and ``--ca``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def _channel(args: argparse.Namespace) -> grpc.Channel:
    if args.ca is None:
        return grpc.insecure_channel(args.target)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=Path(args.ca).read_bytes(),
        private_key=Path(args.key).read_bytes() if args.key else None,
        certificate_chain=Path(args.cert).read_bytes() if args.cert else None,
    )
    return grpc.secure_channel(args.target, credentials)


def main(argv: list[str] | None = None) -> int:
    """Check ``target``'s health; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("target", help="host:port of the service")
    parser.add_argument("--service", default="", help="service name to check (default: the whole server)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer")
    parser.add_argument("--ca", help="PEM CA file (turns TLS on)")
    parser.add_argument("--cert", help="PEM client certificate (mutual TLS)")
    parser.add_argument("--key", help="PEM client key (mutual TLS)")
    args = parser.parse_args(argv)
    with _channel(args) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout
            )
        except grpc.RpcError as exc:
            print(f"{args.target}: {exc.code().name}", file=sys.stderr)
            return 1
    serving = reply.status == health_pb2.HealthCheckResponse.SERVING
    print(f"{args.target}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}")
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
