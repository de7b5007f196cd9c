"""Apply the agent's patch to the clean repository, then put the task's own test files back."""

from __future__ import annotations

import asyncio
import fnmatch
from collections.abc import Iterable, Sequence
from pathlib import PurePosixPath

from evaluator.strategies.base import EvalContext

__all__ = ["DEFAULT_PROTECTED", "apply_patch", "is_protected", "restore_protected", "track_ignored_protected"]

# Files that decide how tests run or what they check. A patch may not change them: whatever it did to
# them is undone before the tests run (new ones are deleted, changed or deleted ones restored). A bare name
# matches at any depth. Every file pytest reads its configuration from (pytest 9's names), every conftest.py,
# the interpreter's start-up hooks and package metadata (where entry-point plugins are declared).
DEFAULT_PROTECTED = (
    "test_*.py", "*_test.py", "tests/*", "test/*", "testing/*", "*/tests/*", "*/test/*",
    "conftest.py", "pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini",
    "setup.cfg", "noxfile.py", "sitecustomize.py", "usercustomize.py",
    "*.dist-info", "*.dist-info/*", "*.egg-info", "*.egg-info/*",
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


async def track_ignored_protected(ctx: EvalContext, patterns: Sequence[str]) -> list[str]:
    """Commit the base tree's git-ignored protected files (an image's ``*.egg-info``, say) to the snapshot.

    Called at Prepare, before any patch: what is tracked is restored when a patch changes it, what is not is
    deleted, so a protected file the base tree already had must be tracked or it would be lost.
    """
    runtime = ctx.need_runtime()
    ignored = [p for p in _split_z((await ctx.git("ls-files", "--others", "-z")).stdout) if is_protected(p, patterns)]
    if not ignored:
        return []
    listing = runtime.root / "eval" / "ignored-protected.txt"
    await runtime.upload("\0".join(ignored).encode("utf-8"), listing)
    await ctx.git("add", "-f", f"--pathspec-from-file={listing}", "--pathspec-file-nul")
    await ctx.git("commit", "-q", "--no-verify", "-m", "polar: the base tree's ignored protected files")
    await ctx.run(["rm", "-f", str(listing)], check=True)
    ctx.log.write(f"tracked {len(ignored)} git-ignored protected file(s) of the base tree", "\n".join(ignored[:50]))
    return ignored
