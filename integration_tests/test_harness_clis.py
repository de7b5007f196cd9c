"""The five real agent CLIs against the real model proxy (scripted backend), each in a network-less sandbox.

Every CLI runs in a local runtime (bubblewrap, loopback only) that reaches the proxy only through the
Unix-socket tunnel, so any attempt to reach the internet fails. Skipped when the CLIs are not installed
(``scripts/setup_harnesses.sh``) or bubblewrap is missing.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import grpc
import pytest
from polar.proxy.v1 import model_proxy_service_pb2 as pb
from polar.proxy.v1 import model_proxy_service_pb2_grpc as pb_grpc

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
from polar_core.convert import completion_from_proto
from polar_core.model_fixtures import build_tiny_tokenizer
from polar_core.records import CompletionRecord, ReconstructionStrategy
from polar_core.server import start_grpc_server
from reconstructor import ReconstructionOptions, reconstruct_session
from runtimes.local import LocalRuntime
from runtimes.spec import Isolation, NetworkMode, RuntimeKind, RuntimeSpec
from runtimes.tunnel import UnixSocketBridge

REPO = Path(__file__).resolve().parents[1]
HARNESS_DIR = REPO / ".harnesses"
BIN_DIR = HARNESS_DIR / "node_modules" / ".bin"
SANDBOX_PORT = 18080
MODEL = "polar-test-model"
ANSWER = "The answer is 42."

pytestmark = [
    pytest.mark.skipif(not (BIN_DIR / "claude").exists(), reason="harness CLIs not installed (setup_harnesses.sh)"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

# The tool each harness offers for shell commands, and the argument holding the command line.
SHELL_TOOLS: Mapping[str, tuple[str, str]] = {
    "claude-code": ("Bash", "command"),
    "codex": ("exec_command", "cmd"),
    "qwen-code": ("run_shell_command", "command"),
    "pi": ("bash", "command"),
    "gemini-cli": ("run_shell_command", "command"),
}


@dataclasses.dataclass
class HarnessRun:
    launch: HarnessLaunch
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    workspace: Path
    completions: list[CompletionRecord]
    patch: str


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tiny_tokenizer()


@dataclasses.dataclass
class Stack:
    tmp: Path
    tokenizer: Any

    async def run(
        self, harness: str, turns: Sequence[dict[str, Any]], *, options: Mapping[str, Any] | None = None
    ) -> HarnessRun:
        eot = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        backend = ScriptedBackend([ScriptTurn.from_dict(t) for t in turns], self.tokenizer, end_of_turn_id=eot)
        settings = ProxySettings(state_dir=self.tmp / "state", fsync=False, context_length=200_000)
        app = ProxyApp(settings, backend, self.tokenizer)
        await app.start()
        server, grpc_port = await start_grpc_server([registration(app)], host="127.0.0.1", port=0)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                stub = pb_grpc.ModelProxyServiceStub(channel)
                opened = await stub.OpenSession(pb.OpenSessionRequest(session_id="s1", model=MODEL))
                endpoints = ProxyEndpoints(
                    token=opened.session_token,
                    anthropic_base_url=opened.anthropic_base_url,
                    openai_base_url=opened.openai_base_url,
                    google_base_url=opened.google_base_url,
                )
                async with UnixSocketBridge("127.0.0.1", app.http_port, self.tmp / "sock" / "proxy.sock") as bridge:
                    run = await self._run_in_sandbox(harness, endpoints, bridge.socket_path, options or {})
                page = await stub.ListCompletions(pb.ListCompletionsRequest(session_id="s1", page_size=100))
                run.completions = [completion_from_proto(c) for c in page.completions]
                return run
        finally:
            await server.stop(None)
            await app.stop()

    async def _run_in_sandbox(
        self, harness: str, endpoints: ProxyEndpoints, socket_path: Path, options: Mapping[str, Any]
    ) -> HarnessRun:
        spec = RuntimeSpec(
            kind=RuntimeKind.LOCAL,
            network=NetworkMode.PROXY,
            proxy_socket=socket_path,
            proxy_port=SANDBOX_PORT,
            isolation=Isolation.BWRAP,
            read_only_paths=(HARNESS_DIR,),
        )
        runtime = LocalRuntime(spec, session_id="s1", base_dir=self.tmp / "sessions")
        await runtime.start()
        root = runtime.root
        workspace = root / "workspace"
        await runtime.upload(b"print('hello')\n", workspace / "main.py")
        init = await runtime.exec(init_workspace_argv(workspace), timeout=30)
        assert init.ok, init.stderr
        ctx = HarnessContext(
            home=root / "home",
            workspace=workspace,
            tmp=root / "tmp",
            instruction="Say the answer.",
            endpoints=rebase_endpoints(endpoints, f"http://127.0.0.1:{SANDBOX_PORT}"),
            model=MODEL,
            options=options,
            bin_dir=PurePosixPath(BIN_DIR),
        )
        launch = get_adapter(harness).prepare(ctx)
        for rel, content in launch.files.items():
            await runtime.upload(content.encode() if isinstance(content, str) else content, ctx.home / rel)
        started = time.monotonic()
        result = await runtime.exec(launch.argv, cwd=launch.cwd, env=launch.env, timeout=100)
        duration = time.monotonic() - started
        host_ws = runtime.host_root / "workspace"
        return HarnessRun(
            launch=launch,
            exit_code=result.exit_code,
            stdout=result.stdout,
            stderr=result.stderr,
            duration_s=duration,
            workspace=host_ws,
            completions=[],
            patch=collect_patch(host_ws),
        )


@pytest.fixture
def stack(tmp_path: Path, tokenizer: Any) -> Stack:
    return Stack(tmp_path, tokenizer)


def _describe(run: HarnessRun) -> str:
    requests = [json.dumps(c.request)[:400] for c in run.completions]
    return (
        f"exit {run.exit_code} after {run.duration_s:.1f}s\nSTDOUT:\n{run.stdout[-3000:]}"
        f"\nSTDERR:\n{run.stderr[-3000:]}"
        f"\nCALLS: {len(run.completions)} {requests}"
    )


def _existing_files(paths: Sequence[PurePosixPath]) -> list[Path]:
    return [f for p in map(Path, paths) if p.exists() for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file()]


PLAIN_CASES = [
    ("claude-code", {}),
    ("codex", {}),
    ("qwen-code", {}),
    ("gemini-cli", {}),
    ("pi", {"provider_mode": "openai-completions"}),
    ("pi", {"provider_mode": "openai-responses"}),
    ("pi", {"provider_mode": "anthropic-messages"}),
    ("pi", {"provider_mode": "google-generative-ai"}),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("harness", "options"), PLAIN_CASES, ids=[f"{h}-{o.get('provider_mode', '')}" for h, o in PLAIN_CASES]
)
async def test_plain_prompt(stack: Stack, harness: str, options: dict[str, Any]) -> None:
    run = await stack.run(harness, [{"text": ANSWER}], options=options)
    print(f"{harness} {options}: {run.duration_s:.1f}s")
    assert run.exit_code == 0, _describe(run)
    assert ANSWER in run.stdout, _describe(run)
    assert len(run.completions) == 1, _describe(run)
    assert run.completions[0].model == MODEL


# Qwen Code starts slowest (~7 s before its first request); its loop can pass 20 s on two busy cores.
TOOL_CASES = ["claude-code", "codex", pytest.param("qwen-code", marks=pytest.mark.slow), "gemini-cli", "pi"]


@pytest.mark.parametrize("harness", TOOL_CASES)
async def test_tool_call_loop(stack: Stack, harness: str) -> None:
    tool, arg = SHELL_TOOLS[harness]
    call = json.dumps({"name": tool, "arguments": {arg: "echo polar-was-here > out.txt"}})
    turns = [{"text": f"<tool_call>\n{call}\n</tool_call>"}, {"text": "Done: wrote out.txt."}]
    run = await stack.run(harness, turns)
    print(f"{harness} tool loop: {run.duration_s:.1f}s")
    assert run.exit_code == 0, _describe(run)
    assert (run.workspace / "out.txt").read_text().strip() == "polar-was-here", _describe(run)
    assert "+polar-was-here" in run.patch
    assert len(run.completions) == 2, _describe(run)
    assert "Done: wrote out.txt." in run.stdout, _describe(run)
    # The harness left its own transcript where the adapter says (the local runtime keeps host paths).
    assert _existing_files(run.launch.log_paths), run.launch.log_paths

    result = reconstruct_session(run.completions, ReconstructionOptions(strategy=ReconstructionStrategy.PREFIX_MERGE))
    assert len(result.traces) == 1, result.stats
    trace = result.traces[0]
    first, second = run.completions
    sampled_1 = len(first.response_token_ids)
    interstitial = len(second.prompt_token_ids) - len(first.prompt_token_ids) - sampled_1
    assert interstitial > 0
    assert trace.loss_mask == [1] * sampled_1 + [0] * interstitial + [1] * len(second.response_token_ids)
    assert (
        trace.response_token_ids[sampled_1 : sampled_1 + interstitial]
        == second.prompt_token_ids[len(first.prompt_token_ids) + sampled_1 :]
    )
