"""Apply the agent's patch to the clean repository, then put the task's own test files back."""

from __future__ import annotations

import asyncio
import fnmatch
from collections.abc import Iterable, Sequence
from pathlib import PurePosixPath

from evaluator.strategies.base import EvalContext

__all__ = ["DEFAULT_PROTECTED", "apply_patch", "is_protected", "restore_protected"]

# Files that decide how tests run or what they check. A patch may not change them: whatever it did to
# them is undone before the tests run (new ones are deleted, changed or deleted ones restored).
DEFAULT_PROTECTED = (
    "test_*.py", "*_test.py", "tests/*", "test/*", "testing/*", "*/tests/*", "*/test/*",
    "conftest.py", "*/conftest.py", "pytest.ini", "tox.ini", "noxfile.py",
)  # fmt: skip


def is_protected(path: str, patterns: Iterable[str]) -> bool:
    """Whether ``path`` (relative to the repository root) matches a pattern, by full path or base name."""
    name = PurePosixPath(path).name
    return any(fnmatch.fnmatchcase(path, pat) or fnmatch.fnmatchcase(name, pat) for pat in patterns)


async def apply_patch(ctx: EvalContext, patch: bytes, *, keep_as: str = "") -> str | None:
    """Apply ``patch`` with ``git apply``; return ``None`` on success, else git's complaint.

    With ``keep_as``, the patch is also kept under that name in the evaluation's own directory (beside its log).
    """
    runtime = ctx.need_runtime()
    if keep_as:
        await asyncio.to_thread((ctx.workdir / keep_as).write_bytes, patch)
    patch_path = runtime.root / "eval" / "agent.patch"
    await runtime.upload(patch, patch_path)
    check = await ctx.git("apply", "--check", "--whitespace=nowarn", str(patch_path), check=False)
    if check.exit_code != 0:
        return (check.stderr or check.stdout).strip() or f"git apply --check exited {check.exit_code}"
    await ctx.git("apply", "--whitespace=nowarn", str(patch_path))
    return None


def _split_z(text: str) -> list[str]:
    return [p for p in text.split("\0") if p]


async def restore_protected(ctx: EvalContext, patterns: Sequence[str]) -> list[str]:
    """Undo the patch's changes to protected files; return the paths that were restored or removed."""
    changed = _split_z((await ctx.git("diff", "--name-only", "--no-renames", "-z", "HEAD")).stdout)
    # Untracked files, ignored ones included: a new, git-ignored conftest.py must not survive either.
    untracked = _split_z((await ctx.git("ls-files", "--others", "-z")).stdout)
    tracked = [p for p in changed if is_protected(p, patterns)]
    added = [p for p in untracked if is_protected(p, patterns)]
    for start in range(0, len(tracked), 100):
        await ctx.git("checkout", "HEAD", "--", *tracked[start : start + 100])
    for start in range(0, len(added), 100):
        await ctx.run(["rm", "-rf", "--", *added[start : start + 100]], cwd=ctx.repo_dir, check=True)
    restored = sorted([*tracked, *added])
    if restored:
        ctx.log.write("restored the task's own test files", "\n".join(restored))
    return restored
