"""The ``command`` strategy: run a script; the reward comes from ``reward.json`` or the exit status.

The script runs in the repository (when there is one, with the agent's patch applied) or in the session
directory, with ``POLAR_REWARD_FILE`` (default ``<session>/eval/reward.json``) and ``POLAR_ARTIFACTS_DIR``
(the agent's files) in its environment. ``reward.json`` is ``{"reward": float, "resolved"?: bool,
"trace_rewards"?: [float, ...]}``. Without it the reward is 1.0 for exit status 0, else 0.0. The session is
resolved when ``resolved`` says so or, absent that, when the reward reaches ``resolved_threshold``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from evaluator.errors import InvalidOptions
from evaluator.models import Artifacts, EvaluationResult
from evaluator.strategies.base import EvalContext, opt_float, opt_str, prepare_repository
from evaluator.strategies.patching import apply_patch
from polar_core.errors import NotFound
from polar_core.records import TerminalStatus
from runtimes import RuntimeDied

__all__ = ["CommandStrategy"]


class CommandStrategy:
    """Options: ``command`` (string for ``sh -c`` or argv list), ``repo``/``repo_path`` (optional),
    ``reward_file``, ``resolved_threshold`` (default 1.0), ``timeout_seconds``."""

    needs_runtime = True

    def __init__(self, options: Mapping[str, Any]) -> None:
        command = options.get("command")
        if isinstance(command, str) and command:
            self.command = ["sh", "-c", command]
        elif isinstance(command, list) and command and all(isinstance(c, str) for c in command):
            self.command = list(command)
        else:
            raise InvalidOptions("command needs option 'command' (a string or a list of strings)")
        self.reward_file = opt_str(options, "reward_file", "eval/reward.json")
        self.threshold = opt_float(options, "resolved_threshold", 1.0) or 0.0
        self.has_repo = bool(options.get("repo") or options.get("repo_path"))

    async def prepare(self, ctx: EvalContext) -> None:
        """Copy the repository in, if there is one."""
        runtime = ctx.need_runtime()
        source = ctx.params.repository_snapshot or ctx.options.get("repo") or ""
        if source or self.has_repo:
            await prepare_repository(ctx, Path(source) if source else None)
        else:
            await ctx.run(["mkdir", "-p", str(runtime.root / "eval")], check=True)

    async def evaluate(self, ctx: EvalContext, artifacts: Artifacts) -> EvaluationResult:
        """Apply the patch, place the files, run the command, read the reward."""
        runtime = ctx.need_runtime()
        if artifacts.patch and ctx.repo_dir is not None:
            problem = await apply_patch(ctx, artifacts.patch, keep_as="agent.patch")
            if problem is not None:
                return EvaluationResult(0.0, TerminalStatus.INVALID_PATCH, error_message=problem[-2000:])
        for rel, content in artifacts.files.items():
            await runtime.upload(content, runtime.root / "artifacts" / rel)
        reward_path = runtime.root / self.reward_file
        env = {
            "POLAR_REWARD_FILE": str(reward_path),
            "POLAR_ARTIFACTS_DIR": str(runtime.root / "artifacts"),
        }
        cwd = ctx.repo_dir or runtime.root
        result = await ctx.run(self.command, cwd=cwd, env=env, timeout=ctx.remaining())
        try:
            raw = await runtime.download(reward_path)
        except NotFound:
            reward = 1.0 if result.exit_code == 0 else 0.0
            return _result(reward, reward >= self.threshold, ())
        try:
            data = json.loads(raw)
            reward = float(data["reward"])
            resolved = bool(data["resolved"]) if "resolved" in data else reward >= self.threshold
            traces = tuple(float(r) for r in data.get("trace_rewards", []))
        except (ValueError, KeyError, TypeError) as exc:
            # The script is the task author's, not the agent's: a malformed file is an evaluator failure.
            raise RuntimeDied(f"malformed {self.reward_file}: {exc}") from None
        return _result(reward, resolved, traces)


def _result(reward: float, resolved: bool, traces: tuple[float, ...]) -> EvaluationResult:
    status = TerminalStatus.RESOLVED if resolved else TerminalStatus.UNRESOLVED
    return EvaluationResult(reward=reward, status=status, trace_rewards=traces)
