"""Leave out of a pytest run the plugins nothing in the repository uses, when loading them is costly.

Hypothesis's pytest plugin (6.x; installed with Polar's ``dev`` extras, so present in the Python the local
runtime runs tests with by default) imports all of Hypothesis at the end of every pytest run, whether or not a
test uses it: about 1.2 CPU-seconds of the 1.4 that a small suite's run costs, the largest single cost of an
evaluation on a gateway host (docs/gateway.md, "Host capacity"). It is blocked (``-p no:hypothesispytest``)
when no file that configures the run mentions hypothesis: pytest's configuration files and ``conftest.py``
files anywhere in the tree and the files named like the listed test files. Tests that use Hypothesis still
run without the plugin (it adds options, a marker and statistics); a repository that names it keeps it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath

from evaluator.strategies.base import EvalContext

__all__ = ["mentions_hypothesis_argv", "without_unused_plugins"]

_PLUGIN = "hypothesispytest"
_PYTEST_CONFIG = ("pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml", "setup.cfg",
                  "tox.ini", "conftest.py")  # fmt: skip


def mentions_hypothesis_argv(test_files: Sequence[str]) -> list[str]:
    """A command (run in the repository) that exits 0 when a file configuring the run mentions hypothesis, 1 when
    none does (``.git`` left out)."""
    names = sorted({*_PYTEST_CONFIG, *(PurePosixPath(f).name for f in test_files)})
    return ["grep", "-rIlqs", "--exclude-dir=.git", *(f"--include={n}" for n in names), "-e", "hypothesis", "."]


async def without_unused_plugins(ctx: EvalContext, argv: Sequence[str], test_files: Sequence[str]) -> list[str]:
    """``argv`` (a ``python -m pytest`` command) with Hypothesis's plugin blocked when nothing mentions it.

    Any ``-p hypothesispytest`` in ``argv`` is dropped with it (a later ``-p NAME`` would lift the block). The
    command is returned as it is when it does not run ``-m pytest``, or when the check fails or finds a mention.
    """
    out = list(argv)
    if "pytest" not in out or out.index("pytest") == 0 or out[out.index("pytest") - 1] != "-m":
        return out
    probe = await ctx.run(mentions_hypothesis_argv(test_files), cwd=ctx.repo_dir, timeout=60.0)
    if probe.exit_code != 1:
        return out
    kept: list[str] = []
    i = 0
    while i < len(out):
        if out[i] == "-p" and i + 1 < len(out) and out[i + 1] == _PLUGIN:
            i += 2
            continue
        kept.append(out[i])
        i += 1
    at = kept.index("pytest") + 1
    return [*kept[:at], "-p", f"no:{_PLUGIN}", *kept[at:]]
