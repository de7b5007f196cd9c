"""aider (PyPI ``aider-chat``): edits files through its text edit formats over LiteLLM's OpenAI Chat Completions.

aider offers the model no tools: the model writes its edits as text in the session's edit format (``whole``:
a file name and the file's full new contents in a fence; ``diff``: search/replace blocks), and aider applies
them. Run with ``--message``, it sends one user message and then *reflects*: it calls the model again with
what went wrong (an edit it could not apply, lint errors, or the failing output of ``--test-cmd`` after an
edit), up to three times. That output is aider's tool result; see docs/harnesses.md for how its re-rendered
prompts reconstruct.
"""

from __future__ import annotations

import json

from gateway.harnesses.base import (
    HarnessContext,
    HarnessLaunch,
    base_environment,
    finish_environment,
    require,
    string_list,
    with_suffix,
)
from gateway.harnesses.python_agents import LITELLM_OFFLINE_ENV, venv_python
from polar_checks.harnesses import HARNESS_OPTIONS, check_options
from polar_core.errors import InvalidArgument

__all__ = ["AIDER_EDIT_FORMATS", "AiderAdapter"]

AIDER_EDIT_FORMATS = ("whole", "diff", "diff-fenced", "udiff", "patch")
_DIR = ".aider"

# Keep aider offline and out of the workspace: no update check, analytics, release notes, URL scraping or
# model warnings; no commits and no .gitignore edit (the patch is the work tree); histories under HOME.
_FIXED_FLAGS = (
    "--yes-always",
    "--no-check-update",
    "--analytics-disable",
    "--no-show-release-notes",
    "--no-show-model-warnings",
    "--no-detect-urls",
    "--no-auto-commits",
    "--no-dirty-commits",
    "--no-gitignore",
    "--no-pretty",
    "--no-fancy-input",
    "--no-browser",
)


class AiderAdapter:
    """Runs ``python -m aider --model openai/M --message INSTRUCTION`` against the proxy's ``/v1``.

    The model's metadata (context window, zero cost) comes from a ``--model-metadata-file`` under ``HOME``, so
    aider never fetches LiteLLM's price list; the same model serves as aider's weak model (commit messages,
    summaries).

    Options:
        edit_format: One of :data:`AIDER_EDIT_FORMATS` (default ``whole``).
        test_cmd: ``--test-cmd`` with ``--auto-test``: run after each edit; a failing run is sent back to the
            model (aider's reflection loop).
        map_tokens: ``--map-tokens`` (default 0: no repository map; a map also writes aider's tag cache,
            ``.aider.tags.cache.v4``, into the workspace, where it lands in the patch unless ignored).
        context_window: ``max_input_tokens`` in the model metadata (default 131072).
        venv: The virtual environment to run from (default ``.harnesses/py/aider``).
    """

    name = "aider"
    option_names = HARNESS_OPTIONS["aider"]
    artifacts = "the chat, input and raw LLM histories under $HOME/.aider."

    def _options(self, ctx: HarnessContext) -> tuple[str, int, int]:
        edit_format = ctx.option("edit_format", "whole")
        if edit_format not in AIDER_EDIT_FORMATS:
            raise InvalidArgument(
                f"option 'edit_format' of harness 'aider' must be one of {', '.join(AIDER_EDIT_FORMATS)}",
                details={"harness": self.name, "field": "edit_format"},
            )
        numbers = []
        for key, default in (("map_tokens", 0), ("context_window", 131072)):
            value = ctx.option(key, default)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgument(
                    f"option {key!r} of harness 'aider' must be a non-negative integer",
                    details={"harness": self.name, "field": key},
                )
            numbers.append(value)
        return str(edit_format), numbers[0], numbers[1]

    def prepare(self, ctx: HarnessContext) -> HarnessLaunch:
        """Build the launch; see :meth:`gateway.harnesses.base.HarnessAdapter.prepare`."""
        check_options(self.name, ctx.options, self.option_names)
        edit_format, map_tokens, context_window = self._options(ctx)
        model = f"openai/{ctx.model}"
        metadata = {
            model: {
                "max_input_tokens": context_window,
                "max_output_tokens": 16384,
                "input_cost_per_token": 0.0,
                "output_cost_per_token": 0.0,
                "litellm_provider": "openai",
                "mode": "chat",
            }
        }
        aider_dir = ctx.home / _DIR
        env = base_environment(ctx, self.name)
        env.update(LITELLM_OFFLINE_ENV)
        env["OPENAI_API_KEY"] = ctx.endpoints.token
        argv = [venv_python(ctx, self.name, "aider", "python3"), "-m", "aider", *_FIXED_FLAGS]
        argv += ["--model", model, "--weak-model", model, "--edit-format", edit_format]
        argv += ["--openai-api-base", with_suffix(require(self.name, ctx.endpoints.openai_base_url, "OpenAI"), "/v1")]
        argv += ["--model-metadata-file", str(aider_dir / "model.metadata.json"), "--map-tokens", str(map_tokens)]
        argv += ["--chat-history-file", str(aider_dir / "chat.history.md")]
        argv += ["--input-history-file", str(aider_dir / "input.history")]
        argv += ["--llm-history-file", str(aider_dir / "llm.history")]
        test_cmd = ctx.option("test_cmd")
        if test_cmd is not None:
            if not isinstance(test_cmd, str) or not test_cmd:
                raise InvalidArgument(
                    "option 'test_cmd' of harness 'aider' must be a command line",
                    details={"harness": self.name, "field": "test_cmd"},
                )
            argv += ["--test-cmd", test_cmd, "--auto-test"]
        argv += string_list(self.name, "extra_args", ctx.option("extra_args"))
        # One argument, so an instruction that looks like an option ("--help") is still the message.
        argv.append(f"--message={ctx.instruction}")
        return HarnessLaunch(
            argv=tuple(argv),
            env=finish_environment(env, ctx, self.name),
            cwd=ctx.workspace,
            files={f"{_DIR}/model.metadata.json": json.dumps(metadata, indent=2) + "\n"},
            log_paths=(aider_dir,),
        )
