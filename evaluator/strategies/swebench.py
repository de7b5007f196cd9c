"""The ``swebench`` strategy: SWE-bench instances graded by the official ``swebench`` package (5.x).

The task's ``options.instance`` holds the record's grading fields (``instance_id, repo, version, base_commit,
test_patch, FAIL_TO_PASS, PASS_TO_PASS, eval_script, log_parser, eval_type``; see
:mod:`polar_client.formats.swebench`). In a clean container of the instance's image, whose ``/testbed``
holds the repository at ``base_commit`` (copied into the session directory, as the runtime's root file system
is read-only: the eval script's ``/testbed`` paths name the copy):

1. the agent's patch is applied with ``git apply`` (``invalid_patch`` when it does not apply);
2. Polar's guard: every change the patch made to a protected file (the files the ``test_patch`` touches,
   every ``conftest.py``, pytest configuration, start-up hooks, package metadata;
   :data:`evaluator.strategies.patching.DEFAULT_PROTECTED`) is undone, so the patch cannot plant a hook that
   rewrites results;
3. the official test spec (``swebench.harness.utils.make_test_spec``) gives the eval script, which resets the
   test files, applies the ``test_patch``, runs the tests between its output markers and records the test
   command's exit status; its combined output is the log;
4. Polar's guard: the log is read line by line with the instance's official log parser, and a test reported
   with two different statuses means code under test printed result lines of its own (a reward hack the
   parser alone, keeping the last line, would believe): ``unresolved``;
5. the official report (``swebench.harness.grading.get_eval_report``) decides: ``resolved`` (reward 1) or
   ``unresolved`` (0), per-test outcomes from its FAIL_TO_PASS / PASS_TO_PASS success and failure lists;
6. Polar's guard, for pytest-based parsers (``junit_check``, default on): pytest also writes a JUnit report
   (``PYTEST_ADDOPTS=--junitxml=`` a fresh, randomly named directory); a ``resolved`` verdict stands only if
   that report exists and agrees on every listed test, so result lines printed by code that then ends pytest
   early (``os._exit(0)`` at import) are not believed.

The log is the eval command's own output stream (stdout and stderr merged; the runtime keeps the last 4 MiB),
never a file the code under test could rewrite after the fact.

``swebench`` is imported on first use (it is heavy: ``modal``, ``datasets``).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any
from xml.etree.ElementTree import ParseError

from evaluator.errors import InvalidOptions
from evaluator.junit import outcomes_for, parse_junit
from evaluator.models import Artifacts, EvaluationResult, TestOutcome, TestStatus
from evaluator.strategies.base import EvalContext, opt_str, opt_str_list
from evaluator.strategies.patching import DEFAULT_PROTECTED, apply_patch, restore_protected, track_ignored_protected
from polar_core.errors import FailedPrecondition, NotFound
from polar_core.records import TerminalStatus
from runtimes import RuntimeDied
from runtimes.editable import editable_paths

__all__ = ["SwebenchStrategy", "conflicting_results"]

_FIELDS = ("instance_id", "repo", "version", "base_commit", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS",
           "eval_script", "log_parser", "eval_type")  # fmt: skip
_DIFF_PATHS = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)
# The eval script's stdout and stderr, in order, as one stream.
_RUN_EVAL = 'cd "$1" && exec /bin/bash "$2" 2>&1'


def _instance(options: Mapping[str, Any]) -> dict[str, Any]:
    """The instance's grading fields, checked: each present, test lists as lists of strings."""
    raw = options.get("instance")
    if not isinstance(raw, Mapping):
        raise InvalidOptions("swebench needs options.instance (the SWE-bench record's grading fields)")
    missing = [key for key in _FIELDS if raw.get(key) is None]
    if missing:
        raise InvalidOptions(f"swebench: options.instance lacks {', '.join(missing)}", details={"field": missing[0]})
    instance = {key: raw[key] for key in _FIELDS}
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        value = instance[key]
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise InvalidOptions(f"swebench: {key} must be a list of test names", details={"field": key})
        instance[key] = list(value)
    for key in (k for k in _FIELDS if k not in ("FAIL_TO_PASS", "PASS_TO_PASS")):
        if not isinstance(instance[key], str):
            raise InvalidOptions(f"swebench: {key} must be a string", details={"field": key})
    return instance


def _test_spec(instance: Mapping[str, Any], image: str) -> Any:
    """The official TestSpec, after checking the parser and eval type against the installed package."""
    try:
        from swebench.harness.constants import EvalType
        from swebench.harness.log_parsers import PARSER_REGISTRY
        from swebench.harness.utils import make_test_spec
    except ImportError as exc:
        raise FailedPrecondition(
            f"the swebench package is not installed on this evaluator ({exc}); scripts/setup.sh installs it"
        ) from None

    if instance["log_parser"] not in PARSER_REGISTRY:
        raise InvalidOptions(
            f"swebench: log_parser {instance['log_parser']!r} is not a parser of the installed swebench "
            f"(repo {instance['repo']}, version {instance['version']})",
            details={"field": "log_parser"},
        )
    if instance["eval_type"] not in {e.value for e in EvalType}:
        raise InvalidOptions(f"swebench: unknown eval_type {instance['eval_type']!r}", details={"field": "eval_type"})
    return make_test_spec({**instance, "image": image})


def _is_pytest_parser(name: str) -> bool:
    """Whether the instance's log parser reads pytest's output (so pytest can also write a JUnit report)."""
    from swebench.harness.log_parsers import PARSER_REGISTRY
    from swebench.harness.log_parsers.python import parse_log_pytest, parse_log_pytest_options, parse_log_pytest_v2

    return PARSER_REGISTRY.get(name) in (parse_log_pytest, parse_log_pytest_options, parse_log_pytest_v2)


def conflicting_results(log: str, test_spec: Any) -> dict[str, set[str]]:
    """Listed tests the official parser finds with more than one status when it reads the log line by line.

    Only FAIL_TO_PASS and PASS_TO_PASS tests count: another test pytest reports twice (passed, then an error at
    teardown) does not decide the verdict, so it must not spoil an honest one.
    """
    from swebench.harness.log_parsers import PARSER_REGISTRY

    parser = PARSER_REGISTRY[test_spec.log_parser]
    listed = {*test_spec.FAIL_TO_PASS, *test_spec.PASS_TO_PASS}
    seen: dict[str, set[str]] = {}
    for line in log.splitlines():
        for test, status in parser(line, test_spec).items():
            if test in listed:
                seen.setdefault(test, set()).add(status)
    return {test: statuses for test, statuses in seen.items() if len(statuses) > 1}


class SwebenchStrategy:
    """Options: ``instance`` (the record's grading fields), ``repo_path`` (the repository in the image, default
    ``/testbed``), ``repo`` (instead, a git repository on the evaluator's host, history included, under its task
    roots), ``protected_files`` (extra globs), ``junit_check`` (default true; only for pytest-based parsers)."""

    needs_runtime = True

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.instance = _instance(options)
        self.spec = _test_spec(self.instance, "")  # refuses an unknown parser or eval type at Prepare
        self.repo_path = opt_str(options, "repo_path", "/testbed")
        self.host_repo = opt_str(options, "repo", "")
        junit_check = options.get("junit_check", True)
        if not isinstance(junit_check, bool):
            raise InvalidOptions("option 'junit_check' must be true or false", details={"field": "junit_check"})
        self.junit_check = junit_check and _is_pytest_parser(self.instance["log_parser"])
        touched = {p for pair in _DIFF_PATHS.findall(self.instance["test_patch"]) for p in pair}
        self.protected = [*DEFAULT_PROTECTED, *sorted(touched), *opt_str_list(options, "protected_files")]
        self.pythonpath: list[str] = []  # the copy's directories standing for the image's editable installs

    async def prepare(self, ctx: EvalContext) -> None:
        """Copy the image's repository (at ``base_commit``) into the session and snapshot it.

        Polar's container runtime runs commands as an unprivileged user on a read-only root file system, so
        the repository is graded in a copy under the session directory; the eval script's ``/testbed`` paths
        are pointed at the copy (see :meth:`evaluate`), and so are the image's editable installs of it
        (:func:`runtimes.editable.editable_paths`, on ``PYTHONPATH``), or the tests would import the unpatched
        ``/testbed``.
        """
        runtime = ctx.need_runtime()
        repo = runtime.root / "repo"
        await ctx.run(["mkdir", "-p", str(runtime.root / "eval")], check=True)
        if self.host_repo:  # a repository on the evaluator's host (a private dataset without images)
            await runtime.upload(Path(self.host_repo), "repo")
        else:
            await ctx.run(["cp", "-R", "--preserve=mode,timestamps,links", f"{self.repo_path}/.", str(repo)],
                          check=True, timeout=600.0)  # fmt: skip
        ctx.repo_dir = repo
        if not self.host_repo:
            # Before any patch code runs: the image's editable installs of the repository, pointed at the copy
            # (on PYTHONPATH for the eval script, ahead of every site directory, venvs' included).
            self.pythonpath = await editable_paths(runtime, self.repo_path, repo)
            if self.pythonpath:
                ctx.log.write(f"editable installs of {self.repo_path} import from the copy", "\n".join(self.pythonpath))
        probe = await ctx.git("rev-parse", "--verify", "-q", f"{self.instance['base_commit']}^{{commit}}", check=False)
        if probe.exit_code != 0:
            raise RuntimeDied(f"{self.repo_path} in the image has no commit {self.instance['base_commit']}")
        await ctx.git("add", "-A")
        await ctx.git("commit", "-q", "--allow-empty", "--no-verify", "-m", "polar: evaluation snapshot")
        await track_ignored_protected(ctx, self.protected)

    async def evaluate(self, ctx: EvalContext, artifacts: Artifacts) -> EvaluationResult:
        """Apply, restore, run the official eval script, grade with the official report, cross-check."""
        runtime = ctx.need_runtime()
        patch = artifacts.patch or b""
        if patch:
            problem = await apply_patch(ctx, patch, keep_as="agent.patch")
            if problem is not None:
                ctx.log.write("the agent's patch does not apply", problem)
                return EvaluationResult(0.0, TerminalStatus.INVALID_PATCH, error_message=problem[-2000:])
        await restore_protected(ctx, self.protected)
        script = runtime.root / "eval" / "eval.sh"
        await runtime.upload(self.spec.eval_script.replace(self.repo_path, str(ctx.repo_dir)).encode("utf-8"), script)
        env: dict[str, str] = {"PYTHONPATH": ":".join(self.pythonpath)} if self.pythonpath else {}
        junit: PurePosixPath | None = None
        if self.junit_check:
            # A fresh, randomly named directory (mkdir without -p: never one planted in advance).
            junit = runtime.root / "eval" / f"report-{secrets.token_hex(12)}" / "junit.xml"
            await ctx.run(["mkdir", str(junit.parent)], check=True)
            env["PYTEST_ADDOPTS"] = f"--junitxml={junit}"
        # The log is the command's own output stream, not a file the code under test could rewrite afterwards.
        run = await ctx.run(["sh", "-c", _RUN_EVAL, "polar-swebench", str(ctx.repo_dir), str(script)],
                            env=env, timeout=ctx.remaining())  # fmt: skip
        log = run.stdout
        log_path = ctx.workdir / "test_output.txt"
        log_path.write_text(log, encoding="utf-8")
        result = self._grade(ctx, patch, log, str(log_path))
        if junit is not None and result.status is TerminalStatus.RESOLVED:
            result = await self._cross_check(ctx, junit, str(log_path), result)
        return result

    def _grade(self, ctx: EvalContext, patch: bytes, log: str, log_path: str) -> EvaluationResult:
        from swebench.harness.grading import get_eval_report

        conflicts = conflicting_results(log, self.spec)
        if conflicts:
            named = ", ".join(f"{t} ({'/'.join(sorted(s))})" for t, s in sorted(conflicts.items())[:5])
            return self._forged(ctx, f"the test output reports tests twice with different results: {named}")
        prediction = {"instance_id": self.instance["instance_id"], "model_patch": patch.decode("utf-8", "replace")}
        report = get_eval_report(self.spec, prediction, log_path, include_tests_status=True)
        entry = report[self.instance["instance_id"]]
        resolved = bool(entry.get("resolved"))
        outcomes = self._outcomes(entry.get("tests_status"))
        ctx.log.write("resolved" if resolved else "unresolved", repr(entry)[-4000:])
        message = ""
        if not resolved and not entry.get("tests_status"):
            # The official classification stays advisory (as in swebench): a patch's code can print any
            # signature, so it must not turn its own failure into a retried infra_error.
            reason = entry.get("infra_failure_reason")
            message = "the eval log has no parsable test results" + (f" (swebench: {reason})" if reason else "")
        return EvaluationResult(
            reward=1.0 if resolved else 0.0,
            status=TerminalStatus.RESOLVED if resolved else TerminalStatus.UNRESOLVED,
            test_outcomes=outcomes,
            error_message=message,
        )

    async def _cross_check(
        self, ctx: EvalContext, junit: PurePosixPath, log_path: str, result: EvaluationResult
    ) -> EvaluationResult:
        """A resolved verdict stands only if pytest's own JUnit report agrees with the log on every listed test."""
        from swebench.harness.grading import get_logs_eval

        try:
            parsed = parse_junit(await ctx.need_runtime().download(junit))
        except (NotFound, ParseError):
            return self._forged(ctx, "the log reports the tests passed but pytest wrote no (readable) JUnit report")
        status_map, _ = get_logs_eval(self.spec, log_path)
        # Ids SWE-bench stores truncated mid-parameter are matched by prefix in its grading: not checked here.
        tests = [
            t for t in (*self.instance["FAIL_TO_PASS"], *self.instance["PASS_TO_PASS"]) if t.count("[") <= t.count("]")
        ]
        disagree = []
        for outcome in outcomes_for(tests, parsed):
            skipped_ok = status_map.get(outcome.test_id) in ("SKIPPED", "XFAIL")
            if outcome.status is not TestStatus.PASSED and not (skipped_ok and outcome.status is TestStatus.SKIPPED):
                disagree.append(f"{outcome.test_id} ({outcome.status.value})")
        if disagree:
            return self._forged(ctx, f"the log and pytest's JUnit report disagree: {', '.join(disagree[:5])}")
        ctx.log.write("pytest's JUnit report agrees with the log", f"{len(tests)} test(s)")
        return result

    def _forged(self, ctx: EvalContext, message: str) -> EvaluationResult:
        ctx.log.write("unresolved: forged or unconfirmed results", message)
        return EvaluationResult(0.0, TerminalStatus.UNRESOLVED, test_outcomes=self._missing(), error_message=message)

    def _outcomes(self, tests_status: Any) -> tuple[TestOutcome, ...]:
        if not isinstance(tests_status, Mapping):
            return self._missing()
        out: list[TestOutcome] = []
        for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
            section = tests_status.get(key) or {}
            out += [TestOutcome(t, TestStatus.PASSED) for t in section.get("success", [])]
            out += [TestOutcome(t, TestStatus.FAILED) for t in section.get("failure", [])]
        return tuple(out)

    def _missing(self) -> tuple[TestOutcome, ...]:
        tests = (*self.instance["FAIL_TO_PASS"], *self.instance["PASS_TO_PASS"])
        return tuple(TestOutcome(t, TestStatus.MISSING) for t in tests)
