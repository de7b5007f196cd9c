"""What the Python agents share: where each one's virtual environment lies, and LiteLLM kept offline.

``scripts/setup_harnesses.sh`` installs each Python agent into its own virtual environment,
``.harnesses/py/<name>``, beside the npm CLIs in ``.harnesses/node_modules``. The gateway only tells adapters
where the npm binaries are (:attr:`HarnessContext.bin_dir`, ``.harnesses/node_modules/.bin``), so the venv is
found from there; the adapter option ``venv`` names another one (an image that brings its own).

Adapters start the venv's ``bin/python`` (``python -m <module>``), never its console scripts: those carry the
venv's absolute host path in their ``#!`` line, which a sandbox that binds the harness tree under another path
(a symlinked checkout, a container mount) cannot resolve, while ``bin/python`` finds its ``pyvenv.cfg`` beside
itself wherever it is mounted. The venv's ``bin`` is not put on ``PATH``: the agent's own shell commands must
see the task's Python, not the agent's.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath
from types import MappingProxyType

from gateway.harnesses.base import HarnessContext
from polar_core.errors import InvalidArgument

__all__ = ["LITELLM_OFFLINE_ENV", "VENV_OPTION", "venv_python"]

VENV_OPTION = "venv"

# LiteLLM (under mini-swe-agent and aider) fetches its model cost map from GitHub at import unless told not to;
# newer releases also gate every other catalog or tokenizer they fetch on LITELLM_OFFLINE_MODE. Its telemetry
# is off unless configured, and these keep its debug banners out of the agent's output.
LITELLM_OFFLINE_ENV: Mapping[str, str] = MappingProxyType(
    {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_OFFLINE_MODE": "true",
        "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
        "LITELLM_LOCAL_BLOG_POSTS": "True",
        "LITELLM_LOG": "ERROR",
    }
)


def _harness_root(bin_dir: PurePosixPath | None) -> PurePosixPath | None:
    if bin_dir is not None and bin_dir.name == ".bin" and bin_dir.parent.name == "node_modules":
        return bin_dir.parent.parent
    return None


def venv_python(ctx: HarnessContext, harness: str, venv_name: str, fallback: str) -> str:
    """The interpreter to start ``harness`` with.

    Args:
        ctx: The session's context (its ``venv`` option, else its ``bin_dir``).
        harness: The harness name, for messages.
        venv_name: The folder under ``.harnesses/py`` (the name of ``gateway/harnesses/python/<name>``).
        fallback: What to run when neither is known (a program on ``PATH`` in the runtime's image).

    Raises:
        InvalidArgument: The ``venv`` option is not an absolute path.
    """
    option = ctx.option(VENV_OPTION)
    if option is not None:
        if not isinstance(option, str) or not option.startswith("/"):
            raise InvalidArgument(
                f"option {VENV_OPTION!r} of harness {harness!r} must be an absolute path (as the runtime sees it)",
                details={"harness": harness, "field": VENV_OPTION},
            )
        return str(PurePosixPath(option) / "bin" / "python")
    root = _harness_root(ctx.bin_dir)
    if root is None:
        return fallback
    return str(root / "py" / venv_name / "bin" / "python")
