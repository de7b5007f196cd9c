"""The ``swe`` strategy: the agent's patch on a clean repository, judged by the task's own tests.

Steps: apply the patch with ``git apply`` (``invalid_patch`` when it does not apply); undo every change to
protected files (tests, ``conftest.py``, pytest configuration); optionally apply the task's ``test_patch``;
run the test command on the files of the FAIL_TO_PASS and PASS_TO_PASS tests with a JUnit XML report;
resolved iff every listed test passed (failed, errored, skipped and missing tests count as not passed).
A run that produces no report at all is an infrastructure error, not a model failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from xml.etree.ElementTree import ParseError

from evaluator.errors import InvalidOptions
from evaluator.junit import outcomes_for, parse_junit
from evaluator.models import Artifacts, EvaluationResult, TestStatus
from evaluator.strategies.base import (
    EvalContext,
    opt_float,
    opt_str_list,
    prepare_repository,
)
from evaluator.strategies.patching import DEFAULT_PROTECTED, apply_patch, restore_protected
from evaluator.strategies.unused_plugins import without_unused_plugins
from polar_core.errors import NotFound
from polar_core.records import TerminalStatus
from runtimes import RuntimeDied

__all__ = ["DEFAULT_TEST_COMMAND", "SweStrategy"]

# -P keeps the repository out of sys.path[0], so a pytest.py planted by a patch cannot replace pytest.
DEFAULT_TEST_COMMAND = (
    "{python}", "-P", "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--junitxml={junit}", "{tests}",
)  # fmt: skip


class SweStrategy:
    """Options: ``fail_to_pass``, ``pass_to_pass`` (pytest node ids), ``repo`` (host path, resolved by the
    task loader), ``repo_path`` (repository inside the image), ``test_command`` (list or string with
    ``{python}``, ``{junit}``, ``{tests}``, ``{repo}``), ``test_patch`` (host path or diff text),
    ``protected_files`` (extra globs), ``timeout_seconds``."""

    needs_runtime = True

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.fail_to_pass = opt_str_list(options, "fail_to_pass")
        self.pass_to_pass = opt_str_list(options, "pass_to_pass")
        if not self.fail_to_pass and not self.pass_to_pass:
            raise InvalidOptions("swe needs fail_to_pass and/or pass_to_pass test ids")
        command = options.get("test_command", list(DEFAULT_TEST_COMMAND))
        if isinstance(command, str):
            command = ["sh", "-c", command]
        if not isinstance(command, list | tuple) or not all(isinstance(c, str) for c in command):
            raise InvalidOptions("test_command must be a string or a list of strings")
        self.test_command: list[str] = list(command)
        self.protected = [*DEFAULT_PROTECTED, *opt_str_list(options, "protected_files")]
        self.protected += sorted({t.partition("::")[0] for t in (*self.fail_to_pass, *self.pass_to_pass)})
        test_patch = options.get("test_patch") or ""
        if not isinstance(test_patch, str):
            raise InvalidOptions("test_patch must be a path or diff text")
        if test_patch and "\n" not in test_patch:
            try:
                test_patch = Path(test_patch).read_text(encoding="utf-8")
            except OSError as exc:
                raise InvalidOptions(f"cannot read test_patch {test_patch}: {exc}") from None
        self.test_patch = test_patch
        self.timeout_s = opt_float(options, "timeout_seconds", None)

    async def prepare(self, ctx: EvalContext) -> None:
        """Copy the repository into the runtime and snapshot it."""
        source = ctx.params.repository_snapshot or ctx.options.get("repo") or ""
        await prepare_repository(ctx, Path(source) if source else None)

    def _command(self, ctx: EvalContext) -> list[str]:
        runtime = ctx.need_runtime()
        files = sorted({t.partition("::")[0] for t in (*self.fail_to_pass, *self.pass_to_pass)})
        values = {
            "python": ctx.python,
            "junit": str(runtime.root / "eval" / "junit.xml"),
            "repo": str(ctx.repo_dir),
            "tests": " ".join(files),
        }
        argv: list[str] = []
        for part in self.test_command:
            if part == "{tests}":
                argv.extend(files)
            else:
                argv.append(part.format(**values))
        return argv

    def _test_files(self) -> list[str]:
        return sorted({t.partition("::")[0] for t in (*self.fail_to_pass, *self.pass_to_pass)})

    async def _apply_test_patch(self, ctx: EvalContext) -> None:
        if not self.test_patch:
            return
        problem = await apply_patch(ctx, self.test_patch.encode("utf-8"))
        if problem is not None:
            raise RuntimeDied(f"the task's test_patch does not apply: {problem}")

    async def evaluate(self, ctx: EvalContext, artifacts: Artifacts) -> EvaluationResult:
        """Apply, restore, run, judge."""
        runtime = ctx.need_runtime()
        if artifacts.patch:
            problem = await apply_patch(ctx, artifacts.patch, keep_as="agent.patch")
            if problem is not None:
                ctx.log.write("the agent's patch does not apply", problem)
                return EvaluationResult(0.0, TerminalStatus.INVALID_PATCH, error_message=problem[-2000:])
        await restore_protected(ctx, self.protected)
        await self._apply_test_patch(ctx)
        argv = self._command(ctx)
        if tuple(self.test_command) == DEFAULT_TEST_COMMAND:  # a task's own command runs as given
            argv = await without_unused_plugins(ctx, argv, self._test_files())
        env = {"PYTHONDONTWRITEBYTECODE": "1"}
        await ctx.run(argv, cwd=ctx.repo_dir, env=env, timeout=ctx.remaining())
        try:
            report = await runtime.download(runtime.root / "eval" / "junit.xml")
        except NotFound:
            raise RuntimeDied("the test command wrote no JUnit report (see the evaluation log)") from None
        (ctx.workdir / "junit.xml").write_bytes(report)
        try:
            parsed = parse_junit(report)
        except ParseError as exc:
            raise RuntimeDied(f"the JUnit report is not XML: {exc}") from None
        outcomes = outcomes_for([*self.fail_to_pass, *self.pass_to_pass], parsed)
        resolved = all(o.status is TestStatus.PASSED for o in outcomes)
        summary = "\n".join(f"{o.status.value:8} {o.test_id}" for o in outcomes)
        ctx.log.write("resolved" if resolved else "unresolved", summary)
        return EvaluationResult(
            reward=1.0 if resolved else 0.0,
            status=TerminalStatus.RESOLVED if resolved else TerminalStatus.UNRESOLVED,
            test_outcomes=tuple(outcomes),
        )
