"""Where a Python agent's virtual environment lies, as the runtime sees it.

``scripts/setup_harnesses.sh`` installs each Python agent into its own environment, ``.harnesses/py/<name>``,
beside the npm CLIs in ``.harnesses/node_modules``. The context names the npm CLIs' ``bin`` directory
(``HarnessContext.bin_dir``); the environments are found relative to it. Adapters run the environment's
interpreter by absolute path (``<venv>/bin/python -m ...``) and never put the environment's ``bin`` on ``PATH``,
so the commands the agent runs in the workspace get the runtime's own ``python``, not the agent's.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from gateway.harnesses.base import HarnessContext

__all__ = ["harness_root", "venv_python"]


def harness_root(bin_dir: PurePosixPath) -> PurePosixPath:
    """The harness installation directory: the parent of ``node_modules/.bin``, else ``bin_dir``'s parent."""
    if bin_dir.name == ".bin" and bin_dir.parent.name == "node_modules":
        return bin_dir.parent.parent
    return bin_dir.parent


def venv_python(ctx: HarnessContext, venv: str, fallback: str = "python3") -> str:
    """The interpreter of the Python agent environment ``venv`` (``<harness root>/py/<venv>/bin/python``).

    Without ``ctx.bin_dir`` (a container image that brings its own programs), ``fallback`` is looked up on
    ``PATH`` instead.
    """
    if ctx.bin_dir is None:
        return fallback
    return str(harness_root(ctx.bin_dir) / "py" / venv / "bin" / "python")
