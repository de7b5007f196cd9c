"""The ``swe`` strategy: the agent's patch on a clean repository, judged by the task's own tests.

Steps: apply the patch with ``git apply`` (``invalid_patch`` when it does not apply); undo every change to
protected files (tests, every ``conftest.py``, every pytest configuration file, start-up hooks, package
metadata); optionally apply the task's ``test_patch``; run pytest with the trusted invocation of
:mod:`evaluator.strategies.pytest_run` on the files of the FAIL_TO_PASS and PASS_TO_PASS tests, the JUnit
report going to a fresh, randomly named directory outside the repository; resolved iff every listed test
passed (failed, errored, skipped and missing tests count as not passed).

A run that leaves no readable report while the runtime is healthy (the command ran and exited, and the
runtime's Python still imports pytest) is ``unresolved``: the code under test stopped pytest (``os._exit``
at import, a crash). Only a runtime that died, a command that could not start (exit 126/127) or a Python
that cannot import pytest is ``infra_error``. Tests that outgrow the runtime's disk quota (``disk_limit``) are
killed by the runtime (``DiskQuotaExceeded``): ``unresolved``, every test missing, the quota in the message.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from xml.etree.ElementTree import ParseError

from evaluator.errors import InvalidOptions
from evaluator.junit import outcomes_for, parse_junit
from evaluator.models import Artifacts, EvaluationResult, TestOutcome, TestStatus
from evaluator.strategies.base import (
    EvalContext,
    opt_float,
    opt_str_list,
    prepare_repository,
)
from evaluator.strategies.patching import DEFAULT_PROTECTED, apply_patch, restore_protected, track_ignored_protected
from evaluator.strategies.pytest_run import TrustedPytest, list_pytest_plugins, pytest_env, trusted_pytest
from evaluator.strategies.unused_plugins import without_unused_plugins
from polar_core.errors import NotFound
from polar_core.records import TerminalStatus
from runtimes import ExecResult, RuntimeDied
from runtimes.errors import DiskQuotaExceeded

__all__ = ["DEFAULT_TEST_COMMAND", "SweStrategy"]

# -P keeps the repository out of sys.path[0], so a pytest.py planted by a patch cannot replace pytest.
# {pytest_args} is the trusted invocation (pytest_run): -c <config> --rootdir <repo> -p no:cacheprovider -p ...
DEFAULT_TEST_COMMAND = ("{python}", "-P", "-m", "pytest", "{pytest_args}", "-rA", "--junitxml={junit}", "{tests}")
# Exit statuses of a shell or exec that could not start the command at all.
_CANNOT_START = (126, 127)


class SweStrategy:
    """Options: ``fail_to_pass``, ``pass_to_pass`` (pytest node ids), ``repo`` (host path, resolved by the
    task loader), ``repo_path`` (repository inside the image), ``test_command`` (list or string with
    ``{python}``, ``{junit}``, ``{tests}``, ``{repo}``, ``{pytest_args}``), ``test_patch`` (host path or diff text),
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
        self.files = sorted({t.partition("::")[0] for t in (*self.fail_to_pass, *self.pass_to_pass)})
        self.trusted = any("{pytest_args}" in part for part in self.test_command)
        self.plugins: list[str] | None = None

    async def prepare(self, ctx: EvalContext) -> None:
        """Copy the repository into the runtime, snapshot it and list the pytest plugins installed there."""
        source = ctx.params.repository_snapshot or ctx.options.get("repo") or ""
        await prepare_repository(ctx, Path(source) if source else None)
        await track_ignored_protected(ctx, self.protected)
        if self.trusted:
            self.plugins = await list_pytest_plugins(ctx)

    def _command(self, ctx: EvalContext, pytest: TrustedPytest) -> list[str]:
        values = {
            "python": ctx.python,
            "junit": str(pytest.junit),
            "repo": str(ctx.repo_dir),
            "tests": " ".join(self.files),
            "pytest_args": pytest.shell(),
        }
        argv: list[str] = []
        for part in self.test_command:
            if part == "{tests}":
                argv.extend(self.files)
            elif part == "{pytest_args}":
                argv.extend(pytest.args)
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
        pytest = await trusted_pytest(ctx, self.files, self.plugins)
        argv = self._command(ctx, pytest)
        if tuple(self.test_command) == DEFAULT_TEST_COMMAND:  # a task's own command runs as given
            argv = await without_unused_plugins(ctx, argv, self._test_files())
        env = pytest.env if self.trusted else pytest_env()
        try:
            run = await ctx.run(argv, cwd=ctx.repo_dir, env=env, timeout=ctx.remaining())
        except DiskQuotaExceeded as exc:
            # The code under test filled the disk; the runtime killed it (and refuses every later command).
            message = f"the test run was killed: {exc.message}"
            ctx.log.write("unresolved: disk quota", message)
            missing = self._missing()
            return EvaluationResult(0.0, TerminalStatus.UNRESOLVED, test_outcomes=missing, error_message=message)
        try:
            report = await runtime.download(pytest.junit)
        except NotFound:
            return await self._no_report(ctx, run, "the test run wrote no JUnit report")
        (ctx.workdir / "junit.xml").write_bytes(report)
        try:
            parsed = parse_junit(report)
        except ParseError as exc:
            return await self._no_report(ctx, run, f"the JUnit report of the test run is not XML ({exc})")
        outcomes = outcomes_for([*self.fail_to_pass, *self.pass_to_pass], parsed)
        resolved = all(o.status is TestStatus.PASSED for o in outcomes)
        summary = "\n".join(f"{o.status.value:8} {o.test_id}" for o in outcomes)
        ctx.log.write("resolved" if resolved else "unresolved", summary)
        return EvaluationResult(
            reward=1.0 if resolved else 0.0,
            status=TerminalStatus.RESOLVED if resolved else TerminalStatus.UNRESOLVED,
            test_outcomes=tuple(outcomes),
        )

    async def _no_report(self, ctx: EvalContext, run: ExecResult, what: str) -> EvaluationResult:
        """No usable report: the code under test's failure when the runtime is healthy, else infra_error."""
        if run.exit_code in _CANNOT_START:
            raise RuntimeDied(f"{what}: the test command could not start (exit {run.exit_code})")
        # The command ran and exited in a live runtime (a dead one raised RuntimeDied). Is the environment
        # itself sound? Outside the repository, so the patch's code is not imported.
        probe = await ctx.run(
            [ctx.python, "-c", "import pytest"], cwd=ctx.need_runtime().root / "eval", env=pytest_env(), timeout=60.0
        )
        if probe.exit_code != 0:
            raise RuntimeDied(f"{what}, and the runtime's {ctx.python} cannot import pytest: {probe.stderr[-500:]}")
        message = (
            f"{what} (pytest exited {run.exit_code}) in a healthy runtime: the code under test stopped the run "
            "(see the evaluation log)"
        )
        ctx.log.write("unresolved: no report", message)
        return EvaluationResult(0.0, TerminalStatus.UNRESOLVED, test_outcomes=self._missing(), error_message=message)

    def _missing(self) -> tuple[TestOutcome, ...]:
        return tuple(TestOutcome(t, TestStatus.MISSING) for t in (*self.fail_to_pass, *self.pass_to_pass))
