"""``polar cluster up | status | scale ROLE N | logs ROLE | supervise | down --topology FILE``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    """Add the ``cluster`` subcommand to ``polar``'s subparsers."""
    cluster = sub.add_parser(
        "cluster",
        help="run a Polar fleet as Slurm jobs from a topology file (docs/deploy.md, 'Slurm')",
        description="Run a Polar fleet as Slurm jobs. Its state (job ids, scripts, credentials, logs) is kept in "
        "FILE's directory, in <FILE without .toml>.cluster/.",
    )
    cluster.add_argument("--topology", required=True, metavar="FILE", help="the topology file (TOML)")
    actions = cluster.add_subparsers(dest="cluster_command", required=True)
    actions.add_parser("up", help="validate, submit what is missing and wait until every role is ready")
    actions.add_parser("status", help="every slot: its job, Slurm state, node and readiness")
    scale = actions.add_parser("scale", help="set a role's count and wait for the new instances")
    scale.add_argument("role")
    scale.add_argument("count", type=int)
    logs = actions.add_parser("logs", help="print the log of a role's instances (their current or latest job)")
    logs.add_argument("role")
    logs.add_argument("--index", type=int, default=None, help="only this instance (from 1)")
    logs.add_argument("--lines", type=int, default=50, help="last lines of each log (0: all)")
    supervise = actions.add_parser("supervise", help="replace ended jobs so the fleet keeps its size, until down")
    supervise.add_argument("--interval", type=float, default=5.0, help="seconds between checks")
    actions.add_parser("down", help="cancel every job (gateways first) and wait until they are gone")
    cluster.set_defaults(func=lambda a: asyncio.run(_run(a)))


async def _run(args: argparse.Namespace) -> int:
    from polar_run.cluster.launcher import ClusterLauncher  # the services' clients load only for this command

    launcher = ClusterLauncher(Path(args.topology))
    command = args.cluster_command
    if command == "up":
        await launcher.up()
    elif command == "scale":
        await launcher.scale(args.role, args.count)
    elif command == "down":
        await launcher.down()
    elif command == "status":
        rows = await launcher.status()
        print(f"{'SLOT':<16} {'JOB':<8} {'STATE':<11} {'NODE':<10} {'READY':<6} NOTE")
        for row in rows:
            ready = "yes" if row.ready else "no"
            print(f"{row.slot:<16} {row.job_id:<8} {row.state:<11} {row.node:<10} {ready:<6} {row.note}")
        return 0 if rows and all(row.ready for row in rows) else 1
    elif command == "logs":
        for path in launcher.log_files(args.role, args.index):
            lines = path.read_text(errors="replace").splitlines()
            print(f"==> {path} <==")
            print("\n".join(lines[-args.lines :] if args.lines else lines))
    elif command == "supervise":
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await launcher.supervise(args.interval, stop=stop)
    sys.stdout.flush()
    return 0
