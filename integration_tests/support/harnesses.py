"""The real agent CLIs against a real model proxy (scripted backend): the one copy tests and bench/ share.

:class:`ScriptedProxy` serves a ``ProxyApp`` over a :class:`ScriptedBackend` (the gRPC service and the HTTP
front); :func:`run_harness` opens a proxy session, bridges the proxy into a network-less bubblewrap sandbox
(a local runtime that reaches it only through the Unix-socket tunnel), runs one CLI there with its adapter's
launch, and returns what it did with the session's completions. Used by ``integration_tests/test_harness_clis.py``,
``integration_tests/test_gateway_clis.py`` (the proxy only) and ``bench/reconstruct/record_harnesses.py``.

The CLIs come from ``scripts/setup_harnesses.sh`` (``.harnesses/``); :func:`clis_installed` says whether they
are there.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Any, Self

import grpc
from polar.proxy.v1 import model_proxy_service_pb2 as pb
from polar.proxy.v1 import model_proxy_service_pb2_grpc as pb_grpc

from gateway import convert
from gateway.harnesses import (
    HarnessContext,
    HarnessLaunch,
    ProxyEndpoints,
    collect_patch,
    get_adapter,
    init_workspace_argv,
    rebase_endpoints,
)
from model_proxy.app import ProxyApp
from model_proxy.backends.scripted import ScriptedBackend, ScriptTurn
from model_proxy.servicer import registration
from model_proxy.settings import ProxySettings
from polar_core.records import CompletionRecord
from polar_core.server import start_grpc_server
from runtimes.local import LocalRuntime
from runtimes.spec import Isolation, NetworkMode, RuntimeKind, RuntimeSpec
from runtimes.tunnel import UnixSocketBridge

__all__ = [
    "BIN_DIR",
    "HARNESS_DIR",
    "MODEL",
    "SANDBOX_PORT",
    "SANDBOX_ROOT",
    "SHELL_TOOLS",
    "HarnessRun",
    "ScriptedProxy",
    "assert_tool_loop_mask",
    "clis_installed",
    "final_turn",
    "run_harness",
    "tool_call_turn",
]

REPO = Path(__file__).resolve().parents[2]
HARNESS_DIR = REPO / ".harnesses"
BIN_DIR = HARNESS_DIR / "node_modules" / ".bin"
# The loopback port inside the sandbox where the tunnel reaches the proxy.
SANDBOX_PORT = 18080
SANDBOX_ROOT = PurePosixPath(RuntimeSpec().container_root)
"""Where the session directory is inside the bubblewrap sandbox (the same for every session)."""
MODEL = "polar-test-model"

# The tool each harness offers for shell commands, and the argument holding the command line.
SHELL_TOOLS: Mapping[str, tuple[str, str]] = {
    "claude-code": ("Bash", "command"),
    "codex": ("exec_command", "cmd"),
    "qwen-code": ("run_shell_command", "command"),
    "gemini-cli": ("run_shell_command", "command"),
    "pi": ("bash", "command"),
    "mini-swe-agent": ("bash", "command"),
    "openai-agents": ("shell", "command"),
    "openhands": ("terminal", "command"),
    "hermes-agent": ("terminal", "command"),
    "opencode": ("bash", "command"),
    "cline": ("run_commands", "commands"),
    "continue": ("Bash", "command"),
}


# Harnesses whose shell tool takes a list of command lines rather than one.
_LIST_ARGUMENT = frozenset({"cline"})


def clis_installed() -> bool:
    """Whether the harness CLIs are installed and bubblewrap is there to sandbox them."""
    return (BIN_DIR / "claude").exists() and shutil.which("bwrap") is not None


def tool_call_turn(harness: str, command: str) -> dict[str, Any]:
    """A scripted turn in which the model calls ``harness``'s shell tool with ``command``."""
    tool, arg = SHELL_TOOLS[harness]
    value: str | list[str] = [command] if harness in _LIST_ARGUMENT else command
    call = json.dumps({"name": tool, "arguments": {arg: value}})
    return {"text": f"<tool_call>\n{call}\n</tool_call>"}


def final_turn(harness: str, text: str) -> dict[str, Any]:
    """A scripted turn that ends ``harness``'s session with the answer ``text``.

    Most harnesses stop at a reply without a tool call; mini-swe-agent stops only when its shell prints
    ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` first (the lines after it are its submission, which it prints).
    """
    if harness == "mini-swe-agent":
        command = f"echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && printf '%s\\n' {shlex.quote(text)}"
        return tool_call_turn(harness, command)
    return {"text": text}


class ScriptedProxy:
    """A model proxy (gRPC and HTTP) answering from a script of turns, on the tiny ChatML tokenizer.

    Use as ``async with ScriptedProxy(turns, tokenizer, state_dir) as proxy:``; ``proxy.grpc_port`` and
    ``proxy.http_port`` are bound inside.
    """

    def __init__(self, turns: Sequence[Mapping[str, Any]], tokenizer: Any, state_dir: Path) -> None:
        eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
        backend = ScriptedBackend([ScriptTurn.from_dict(dict(t)) for t in turns], tokenizer, end_of_turn_id=eot)
        settings = ProxySettings(state_dir=state_dir, fsync=False, context_length=200_000)
        self.app = ProxyApp(settings, backend, tokenizer)
        self._server: grpc.aio.Server | None = None
        self.grpc_port = 0

    @property
    def http_port(self) -> int:
        """The port of the proxy's HTTP front."""
        return self.app.http_port

    async def __aenter__(self) -> Self:
        await self.app.start()
        try:
            self._server, self.grpc_port = await start_grpc_server([registration(self.app)], host="127.0.0.1", port=0)
        except BaseException:
            await self.app.close()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._server is not None:
            await self._server.stop(None)
        await self.app.close()

    async def list_completions(self, session_id: str) -> list[CompletionRecord]:
        """The session's completions (one page of up to 100)."""
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.grpc_port}") as channel:
            page = await pb_grpc.ModelProxyServiceStub(channel).ListCompletions(
                pb.ListCompletionsRequest(session_id=session_id, page_size=100)
            )
        return [convert.completion_from_proto(c) for c in page.completions]

    async def open_session(self, session_id: str) -> ProxyEndpoints:
        """Open a proxy session for :data:`MODEL` and return its endpoints."""
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.grpc_port}") as channel:
            opened = await pb_grpc.ModelProxyServiceStub(channel).OpenSession(
                pb.OpenSessionRequest(session_id=session_id, model=MODEL)
            )
        return convert.endpoints_from_proto(opened)


@dataclasses.dataclass
class HarnessRun:
    """What one CLI run did: its launch, exit, output, workspace (host path), patch and completions."""

    launch: HarnessLaunch
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    workspace: Path
    patch: str
    host_root: Path
    completions: list[CompletionRecord] = dataclasses.field(default_factory=list)

    def host_path(self, inner: str | PurePosixPath) -> Path:
        """Where a path inside the sandbox (below :data:`SANDBOX_ROOT`) lies on the host."""
        return self.host_root / PurePosixPath(inner).relative_to(SANDBOX_ROOT)

    @property
    def host_log_paths(self) -> list[Path]:
        """The adapter's log paths (sandbox paths) on the host."""
        return [self.host_path(p) for p in self.launch.log_paths]

    def describe(self, tail: int = 3000) -> str:
        """Exit, output tails and the calls made, for assertion messages."""
        requests = [json.dumps(c.request)[:400] for c in self.completions]
        return (
            f"exit {self.exit_code} after {self.duration_s:.1f}s\nSTDOUT:\n{self.stdout[-tail:]}"
            f"\nSTDERR:\n{self.stderr[-tail:]}\nCALLS: {len(self.completions)} {requests}"
        )


async def run_harness(
    harness: str,
    turns: Sequence[Mapping[str, Any]],
    *,
    tmp: Path,
    tokenizer: Any,
    session_id: str = "s1",
    instruction: str = "Say the answer.",
    options: Mapping[str, Any] | None = None,
    timeout_s: float = 100.0,
    home_files: Mapping[str, str] | None = None,
) -> HarnessRun:
    """Run ``harness`` once in a network-less sandbox against a proxy answering ``turns``.

    ``home_files`` (path under ``HOME`` → text) are written besides the adapter's files, before launch.
    """
    async with ScriptedProxy(turns, tokenizer, tmp / "state") as proxy:
        endpoints = await proxy.open_session(session_id)
        async with UnixSocketBridge("127.0.0.1", proxy.http_port, tmp / "sock" / "proxy.sock") as bridge:
            run = await _run_in_sandbox(
                harness,
                _sandbox(bridge.socket_path, tmp, session_id),
                endpoints,
                instruction=instruction,
                options=options or {},
                timeout_s=timeout_s,
                home_files=home_files or {},
            )
        run.completions = await proxy.list_completions(session_id)
        return run


def _sandbox(socket_path: Path, tmp: Path, session_id: str) -> LocalRuntime:
    spec = RuntimeSpec(
        kind=RuntimeKind.LOCAL,
        network=NetworkMode.PROXY,
        proxy_socket=socket_path,
        proxy_port=SANDBOX_PORT,
        isolation=Isolation.BWRAP,
        # Also the real directory when ``.harnesses`` is a symbolic link (a worktree sharing one checkout's
        # installation): the Python agents' environments link to their interpreters by real path.
        read_only_paths=tuple(dict.fromkeys((HARNESS_DIR, HARNESS_DIR.resolve()))),
    )
    return LocalRuntime(spec, session_id=session_id, base_dir=tmp / "sessions")


async def _run_in_sandbox(
    harness: str,
    runtime: LocalRuntime,
    endpoints: ProxyEndpoints,
    *,
    instruction: str,
    options: Mapping[str, Any],
    timeout_s: float,
    home_files: Mapping[str, str] | None = None,
) -> HarnessRun:
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
        instruction=instruction,
        endpoints=rebase_endpoints(endpoints, f"http://127.0.0.1:{SANDBOX_PORT}"),
        model=MODEL,
        options=options,
        bin_dir=PurePosixPath(BIN_DIR),
    )
    launch = get_adapter(harness).prepare(ctx)
    for rel, content in {**launch.files, **(home_files or {})}.items():
        await runtime.upload(content.encode() if isinstance(content, str) else content, ctx.home / rel)
    started = time.monotonic()
    result = await runtime.exec(launch.argv, cwd=launch.cwd, env=launch.env, timeout=timeout_s)
    duration = time.monotonic() - started
    host_ws = runtime.host_root / "workspace"
    return HarnessRun(
        launch=launch,
        exit_code=result.exit_code,
        stdout=result.stdout,
        stderr=result.stderr,
        duration_s=duration,
        workspace=host_ws,
        patch=collect_patch(host_ws),
        host_root=runtime.host_root,
    )


def assert_tool_loop_mask(trace: Any, first: CompletionRecord, second: CompletionRecord) -> list[int]:
    """Check the prefix-merged trace (a record or a message) of a tool call then an answer; return its masked tokens.

    The trace is the first call's sampled tokens (mask 1), the tool result and the CLI's framing that the
    second prompt added (mask 0), then the answer's sampled tokens (mask 1).
    """
    sampled_1 = len(first.response_token_ids)
    interstitial = len(second.prompt_token_ids) - len(first.prompt_token_ids) - sampled_1
    assert interstitial > 0
    assert list(trace.loss_mask) == [1] * sampled_1 + [0] * interstitial + [1] * len(second.response_token_ids)
    masked = list(trace.response_token_ids[sampled_1 : sampled_1 + interstitial])
    assert masked == list(second.prompt_token_ids[len(first.prompt_token_ids) + sampled_1 :])
    return masked
