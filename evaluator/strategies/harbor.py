"""The ``harbor`` strategy: a Harbor / Terminal-Bench task's own verifier, in a clean container of its image.

Harbor runs ``tests/test.sh`` in the agent's container after the agent. Polar, as for ``swe``, grades in a fresh
container of the same image (built by :mod:`runtimes.image_build`, whose Polar layer links the image's
``WORKDIR`` to the session workspace, ``/tests`` to ``<root>/tests`` and ``/logs`` to ``<root>/logs``):

1. Prepare: the workspace's base (``repo``, the host copy of the image's ``WORKDIR``) is copied to
   ``<root>/workspace`` and committed, exactly as the gateway laid it out for the agent.
2. Evaluate: the agent's patch is applied there with ``git apply`` (``invalid_patch`` when it does not apply;
   git refuses paths outside the workspace and writes through symlinks). Only then are ``<root>/tests`` and
   ``<root>/logs`` made, empty, and the task's ``tests/`` copied in from the trusted task directory on the
   evaluator's host (``tests_dir``), never from anything the agent touched: a patch cannot plant a reward file
   or change a test.
3. ``bash /tests/test.sh`` runs in ``WORKDIR`` with the task's ``verifier.env`` under the verifier timeout
   (``verifier_timeout_seconds``; past it: ``eval_timeout``), and ``PYTHONSAFEPATH=1`` unless that env sets it:
   ``python3 -m pytest`` run in ``WORKDIR`` would otherwise import a ``pytest.py`` the patch put there.
4. The reward is read as Harbor reads it: ``/logs/verifier/reward.json`` first (an object of named numbers; its
   ``reward``, else its only value, else their mean), else ``reward.txt`` (one number). No reward file, an
   empty one, or one that is not a finite number is ``unresolved`` with reward 0 and the reason in the message
   (the agent's code runs inside the tests, so a garbage reward may be its doing: never retried as infra_error).
   Resolved when the reward reaches ``resolved_threshold`` (default 1.0).

What carries over from the agent's run is the patch of ``WORKDIR``: state the agent left elsewhere in its
container (installed packages, files under ``/etc`` or ``/root``) does not; the root file system is read-only
to the agent anyway. Tests and the agent's code run as the runtime's unprivileged user.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from evaluator.errors import InvalidOptions
from evaluator.models import Artifacts, EvaluationResult
from evaluator.strategies.base import EvalContext, opt_float, opt_str
from evaluator.strategies.patching import apply_patch
from polar_core.errors import NotFound
from polar_core.records import TerminalStatus
from runtimes.sandbox_policy import RESERVED_ENV

__all__ = ["HarborStrategy", "parse_reward"]

_SNAPSHOT_EXCLUDE = (".git",)
_REWARD_FILES = ("logs/verifier/reward.json", "logs/verifier/reward.txt")
_RESERVED_PREFIXES = ("LD_", "POLAR_")


class HarborStrategy:
    """Options: ``repo`` (host copy of the image's WORKDIR), ``tests_dir`` (host path of the task's ``tests/``),
    ``workdir`` (the image's WORKDIR), ``verifier_timeout_seconds``, ``env`` (``verifier.env``),
    ``resolved_threshold`` (default 1.0), ``timeout_seconds``."""

    needs_runtime = True

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.repo = Path(opt_str(options, "repo"))
        self.tests_dir = Path(opt_str(options, "tests_dir"))
        if not opt_str(options, "repo") or not opt_str(options, "tests_dir"):
            raise InvalidOptions("harbor needs options 'repo' and 'tests_dir' (a Harbor task directory gives both)")
        self.workdir = opt_str(options, "workdir", "/app")
        self.verifier_timeout_s = opt_float(options, "verifier_timeout_seconds", 600.0) or 600.0
        self.threshold = opt_float(options, "resolved_threshold", 1.0)
        env = options.get("env") or {}
        if not isinstance(env, Mapping):
            raise InvalidOptions("option 'env' must be a mapping")
        self.env = {str(k): str(v) for k, v in env.items()}
        for key in self.env:
            upper = key.upper()
            if upper in RESERVED_ENV or upper.startswith(_RESERVED_PREFIXES):
                raise InvalidOptions(f"verifier env may not set {key!r}: the runtime sets it")

    async def prepare(self, ctx: EvalContext) -> None:
        """Copy the workspace's base in and commit it; check the task's tests are where the task says."""
        runtime = ctx.need_runtime()
        if not await asyncio.to_thread((self.tests_dir / "test.sh").is_file):
            raise InvalidOptions(f"tests_dir {self.tests_dir} has no test.sh")
        if not await asyncio.to_thread(self.repo.is_dir):
            raise InvalidOptions(f"the workspace base {self.repo} is not a directory (was the environment built?)")
        link = await ctx.run(["readlink", "/tests"], timeout=30.0)
        if link.stdout.strip() != str(runtime.root / "tests"):
            raise InvalidOptions(
                "the runtime image is not a Polar-built Harbor image (/tests does not link into the session "
                f"directory {runtime.root}); build it with polar_client.formats.harbor"
            )
        await runtime.upload(self.repo, "workspace", exclude=_SNAPSHOT_EXCLUDE)
        ctx.repo_dir = runtime.root / "workspace"
        await ctx.run(["mkdir", "-p", str(runtime.root / "eval")], check=True)
        await ctx.git("init", "-q")
        await ctx.git("add", "-A")
        await ctx.git("commit", "-q", "--allow-empty", "--no-verify", "-m", "polar: evaluation snapshot")

    async def evaluate(self, ctx: EvalContext, artifacts: Artifacts) -> EvaluationResult:
        """Apply the patch, put the trusted tests in, run ``test.sh``, read the reward."""
        runtime = ctx.need_runtime()
        if artifacts.patch:
            problem = await apply_patch(ctx, artifacts.patch, keep_as="agent.patch")
            if problem is not None:
                ctx.log.write("the agent's patch does not apply", problem)
                return EvaluationResult(0.0, TerminalStatus.INVALID_PATCH, error_message=problem[-2000:])
        root = runtime.root
        fresh = ['rm -rf -- "$0/tests" "$0/logs" && mkdir -p "$0/logs/verifier" "$0/logs/agent"']
        await ctx.run(["sh", "-c", *fresh, str(root)], check=True)
        await runtime.upload(self.tests_dir, "tests")
        env = {"PYTHONSAFEPATH": "1", **self.env}  # `python3 -m pytest` in /app must not import the agent's pytest.py
        run = await ctx.run(["bash", "/tests/test.sh"], cwd=ctx.repo_dir, env=env,
                            timeout=self.verifier_timeout_s)  # fmt: skip
        (ctx.workdir / "test-stdout.txt").write_text(run.stdout[-200_000:] + run.stderr[-200_000:], encoding="utf-8")
        for rel in _REWARD_FILES:
            try:
                raw = await runtime.download(root / rel)
            except NotFound:
                continue
            reward, problem = parse_reward(raw, json_file=rel.endswith(".json"))
            if problem is not None:
                message = f"/{rel}: {problem} (test.sh exited {run.exit_code})"
                ctx.log.write("unresolved: unusable reward", message)
                return EvaluationResult(0.0, TerminalStatus.UNRESOLVED, error_message=message)
            resolved = self.threshold is not None and reward >= self.threshold
            ctx.log.write(f"reward {reward:g} from /{rel}", f"test.sh exited {run.exit_code}")
            status = TerminalStatus.RESOLVED if resolved else TerminalStatus.UNRESOLVED
            return EvaluationResult(reward, status)
        message = f"test.sh (exit {run.exit_code}) wrote no /logs/verifier/reward.txt or reward.json"
        ctx.log.write("unresolved: no reward", message)
        return EvaluationResult(0.0, TerminalStatus.UNRESOLVED, error_message=message)


def parse_reward(raw: bytes, *, json_file: bool) -> tuple[float, str | None]:
    """A reward file's reward, or ``(0.0, why)`` when it holds no finite number.

    ``reward.txt``: one number. ``reward.json``: a number, or an object of named numbers (its ``reward``, else
    its only value, else their mean; Harbor keeps them all, Polar trains on one).
    """
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return 0.0, "the reward file is not text"
    if not text:
        return 0.0, "the reward file is empty"
    try:
        value: Any = json.loads(text) if json_file else float(text)
    except ValueError:
        return 0.0, f"not a number: {text[:80]!r}"
    if isinstance(value, Mapping):
        numbers = list(value.values())
        if "reward" in value:
            numbers = [value["reward"]]
        if not numbers:
            return 0.0, "the reward object is empty"
        if not all(isinstance(n, int | float) and not isinstance(n, bool) for n in numbers):
            return 0.0, f"non-numeric reward in {text[:80]!r}"
        value = sum(float(n) for n in numbers) / len(numbers)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0, f"not a number: {text[:80]!r}"
    if not math.isfinite(float(value)):
        return 0.0, f"non-finite reward {value!r} refused"
    return float(value), None
