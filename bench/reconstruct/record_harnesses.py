"""Record one real session of each agent CLI against the model proxy (scripted backend, tiny tokenizer).

Each CLI runs exactly as in ``integration_tests/test_harness_clis.py``: a ``ProxyApp`` with a
``ScriptedBackend`` on the tiny tokenizer, the gRPC service, ``OpenSession``, a ``UnixSocketBridge`` and the
local bubblewrap runtime. The script makes four calls of the harness's own shell tool (each writing a
different file), then a final text answer. The session's completions (``ListCompletions``) are written as
``<out>/<cli>.jsonl`` for ``python -m bench.reconstruct --sessions``.

Run: ``.venv/bin/python -m bench.reconstruct.record_harnesses --out bench/reconstruct/data [--only CLI]``.
Needs the CLIs (``scripts/setup_harnesses.sh``) and bubblewrap.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import grpc
from polar.proxy.v1 import model_proxy_service_pb2 as pb
from polar.proxy.v1 import model_proxy_service_pb2_grpc as pb_grpc

from gateway.harnesses import (
    HarnessContext,
    ProxyEndpoints,
    get_adapter,
    init_workspace_argv,
    rebase_endpoints,
)
from model_proxy.app import ProxyApp
from model_proxy.backends.scripted import ScriptedBackend, ScriptTurn
from model_proxy.servicer import registration
from model_proxy.settings import ProxySettings
from polar_core.convert import completion_from_proto
from polar_core.model_fixtures import build_tiny_tokenizer
from polar_core.records import CompletionRecord, write_jsonl
from polar_core.server import start_grpc_server
from runtimes.local import LocalRuntime
from runtimes.spec import Isolation, NetworkMode, RuntimeKind, RuntimeSpec
from runtimes.tunnel import UnixSocketBridge

REPO = Path(__file__).resolve().parents[2]
HARNESS_DIR = REPO / ".harnesses"
BIN_DIR = HARNESS_DIR / "node_modules" / ".bin"
SANDBOX_PORT = 18080
MODEL = "polar-test-model"
TOOL_CALLS = 4

# The tool each harness offers for shell commands, and the argument holding the command line.
SHELL_TOOLS: Mapping[str, tuple[str, str]] = {
    "claude-code": ("Bash", "command"),
    "codex": ("exec_command", "cmd"),
    "qwen-code": ("run_shell_command", "command"),
    "gemini-cli": ("run_shell_command", "command"),
    "pi": ("bash", "command"),
}


def script(harness: str) -> list[dict[str, Any]]:
    """Four shell-tool calls, each writing a different file, then a final text answer."""
    tool, arg = SHELL_TOOLS[harness]
    turns: list[dict[str, Any]] = []
    for i in range(1, TOOL_CALLS + 1):
        call = json.dumps({"name": tool, "arguments": {arg: f"echo polar-step-{i} > out{i}.txt"}})
        turns.append({"text": f"<tool_call>\n{call}\n</tool_call>"})
    turns.append({"text": f"Done: wrote out1.txt to out{TOOL_CALLS}.txt."})
    return turns


async def record(harness: str, tmp: Path, tokenizer: Any) -> tuple[int, str, list[CompletionRecord]]:
    """Run one session of ``harness``; return its exit code, output tail and completions."""
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    backend = ScriptedBackend([ScriptTurn.from_dict(t) for t in script(harness)], tokenizer, end_of_turn_id=eot)
    settings = ProxySettings(state_dir=tmp / "state", fsync=False, context_length=200_000)
    app = ProxyApp(settings, backend, tokenizer)
    await app.start()
    server, grpc_port = await start_grpc_server([registration(app)], host="127.0.0.1", port=0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = pb_grpc.ModelProxyServiceStub(channel)
            opened = await stub.OpenSession(pb.OpenSessionRequest(session_id=harness, model=MODEL))
            endpoints = ProxyEndpoints(
                token=opened.session_token,
                anthropic_base_url=opened.anthropic_base_url,
                openai_base_url=opened.openai_base_url,
                google_base_url=opened.google_base_url,
            )
            async with UnixSocketBridge("127.0.0.1", app.http_port, tmp / "sock" / "proxy.sock") as bridge:
                code, output = await _run_in_sandbox(harness, tmp, endpoints, bridge.socket_path)
            page = await stub.ListCompletions(pb.ListCompletionsRequest(session_id=harness, page_size=100))
            return code, output, [completion_from_proto(c) for c in page.completions]
    finally:
        await server.stop(None)
        await app.stop()


async def _run_in_sandbox(harness: str, tmp: Path, endpoints: ProxyEndpoints, socket_path: Path) -> tuple[int, str]:
    spec = RuntimeSpec(
        kind=RuntimeKind.LOCAL,
        network=NetworkMode.PROXY,
        proxy_socket=socket_path,
        proxy_port=SANDBOX_PORT,
        isolation=Isolation.BWRAP,
        read_only_paths=(HARNESS_DIR,),
    )
    runtime = LocalRuntime(spec, session_id=harness, base_dir=tmp / "sessions")
    await runtime.start()
    root = runtime.root
    workspace = root / "workspace"
    await runtime.upload(b"print('hello')\n", workspace / "main.py")
    init = await runtime.exec(init_workspace_argv(workspace), timeout=30)
    if not init.ok:
        raise RuntimeError(f"workspace init failed: {init.stderr}")
    ctx = HarnessContext(
        home=root / "home",
        workspace=workspace,
        tmp=root / "tmp",
        instruction=f"Write out1.txt to out{TOOL_CALLS}.txt with the shell, one command each, then say done.",
        endpoints=rebase_endpoints(endpoints, f"http://127.0.0.1:{SANDBOX_PORT}"),
        model=MODEL,
        options={},
        bin_dir=PurePosixPath(BIN_DIR),
    )
    launch = get_adapter(harness).prepare(ctx)
    for rel, content in launch.files.items():
        await runtime.upload(content.encode() if isinstance(content, str) else content, ctx.home / rel)
    result = await runtime.exec(launch.argv, cwd=launch.cwd, env=launch.env, timeout=180)
    host_ws = runtime.host_root / "workspace"
    written = sorted(p.name for p in host_ws.glob("out*.txt"))
    if len(written) != TOOL_CALLS:
        raise RuntimeError(f"expected {TOOL_CALLS} files written by the shell tool, got {written}")
    return result.exit_code, f"files {written}\nSTDOUT:\n{result.stdout[-1500:]}\nSTDERR:\n{result.stderr[-1500:]}"


async def main_async(out: Path, harnesses: Sequence[str]) -> int:
    tokenizer = build_tiny_tokenizer()
    failed = 0
    for harness in harnesses:
        with tempfile.TemporaryDirectory(prefix=f"rec-{harness}-") as tmp:
            try:
                code, output, completions = await record(harness, Path(tmp), tokenizer)
            except Exception as exc:  # report it and go on with the next CLI
                print(f"{harness}: FAILED ({exc!r})", file=sys.stderr)
                failed += 1
                continue
        expected = TOOL_CALLS + 1
        if code != 0 or len(completions) != expected:
            print(f"{harness}: FAILED exit {code}, {len(completions)}/{expected} calls\n{output}", file=sys.stderr)
            failed += 1
            continue
        path = out / f"{harness}.jsonl"
        write_jsonl(path, (c.to_dict() for c in completions))
        print(f"{harness}: {len(completions)} calls -> {path} ({path.stat().st_size:,} bytes)")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.reconstruct.record_harnesses")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "reconstruct" / "data")
    parser.add_argument("--only", choices=list(SHELL_TOOLS), action="append", help="record only these CLIs")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    sys.exit(asyncio.run(main_async(args.out, args.only or list(SHELL_TOOLS))))


if __name__ == "__main__":
    main()
