"""What strategies share: the repository snapshot and option readers (re-exporting the context and the protocol).

:class:`EvalContext` lives in :mod:`evaluator.eval_context`, the ``Strategy`` protocol in :mod:`evaluator.ports`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from evaluator.errors import InvalidOptions
from evaluator.eval_context import EvalContext, EvalTimeout
from evaluator.ports import Strategy
from polar_core.git_trees import TreeCache, is_git_repository

__all__ = [
    "EvalContext",
    "EvalTimeout",
    "Strategy",
    "opt_float",
    "opt_str",
    "opt_str_list",
    "prepare_repository",
]

_SNAPSHOT_EXCLUDE = (".git", "__pycache__", ".pytest_cache", "*.pyc")


async def prepare_repository(ctx: EvalContext, source: Path | None) -> None:
    """Put the repository in the runtime and commit it as a fresh git snapshot.

    The source is copied without its ``.git`` (so no history, e.g. future commits, reaches the runtime): a
    git repository as the tree of ``options["base_commit"]`` (``HEAD`` without one), exported exactly as the
    gateway gave it to the agent, a plain directory as it is. Without a source, ``options["repo_path"]`` names
    a repository already in the image.
    """
    runtime = ctx.need_runtime()
    if source is not None:
        if not await asyncio.to_thread(source.is_dir):
            raise InvalidOptions(f"repository snapshot {source} is not a directory")
        source = await asyncio.to_thread(_base_tree, source, ctx.options.get("base_commit") or "")
        await runtime.upload(source, "repo", exclude=_SNAPSHOT_EXCLUDE)
        ctx.repo_dir = runtime.root / "repo"
    else:
        in_image = ctx.options.get("repo_path")
        if not isinstance(in_image, str) or not in_image:
            raise InvalidOptions("the evaluator needs a repository: options.repo, repo_path or a snapshot")
        ctx.repo_dir = PurePosixPath(in_image)
    await ctx.run(["mkdir", "-p", str(runtime.root / "eval")], check=True)
    probe = await ctx.git("rev-parse", "--is-inside-work-tree", check=False)
    if probe.exit_code != 0 or source is not None:
        await ctx.git("init", "-q")
    await ctx.git("add", "-A")
    await ctx.git("commit", "-q", "--allow-empty", "--no-verify", "-m", "polar: evaluation snapshot")


def _base_tree(source: Path, base_commit: object) -> Path:
    """The directory to copy in: the export of ``base_commit``'s tree for a git repository, else ``source``."""
    if not isinstance(base_commit, str):
        raise InvalidOptions("option 'base_commit' must be a string")
    if not is_git_repository(source) and not base_commit:
        return source
    trees = TreeCache()
    return trees.export(trees.resolve(source, base_commit))


def opt_str(options: Mapping[str, Any], key: str, default: str = "") -> str:
    """A string option."""
    value = options.get(key, default)
    if not isinstance(value, str):
        raise InvalidOptions(f"option {key!r} must be a string")
    return value


def opt_float(options: Mapping[str, Any], key: str, default: float | None) -> float | None:
    """A number option."""
    value = options.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidOptions(f"option {key!r} must be a number")
    return float(value)


def opt_str_list(options: Mapping[str, Any], key: str) -> list[str]:
    """A list-of-strings option (missing means empty)."""
    value = options.get(key, [])
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise InvalidOptions(f"option {key!r} must be a list of strings")
    return list(value)
