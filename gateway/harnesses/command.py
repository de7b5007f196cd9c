"""A generic harness: any command line, given the proxy endpoints through environment variables."""

from __future__ import annotations

from gateway.harnesses.base import (
    HarnessContext,
    HarnessLaunch,
    base_environment,
    finish_environment,
    string_list,
    with_suffix,
    without_suffix,
)
from polar_checks.harnesses import HARNESS_OPTIONS, check_options
from polar_core.errors import InvalidArgument

__all__ = ["CommandAdapter"]


class CommandAdapter:
    """Runs ``options.argv`` in the workspace; for custom agents and scripts.

    In every argument the placeholders ``{instruction}``, ``{model}``, ``{workspace}`` and ``{home}`` are
    replaced (plain substitution, no other formatting). The environment carries ``POLAR_SESSION_TOKEN``,
    ``POLAR_MODEL``, ``POLAR_INSTRUCTION``, ``POLAR_WORKSPACE``, ``POLAR_SESSION_ID``, ``POLAR_SAMPLE_INDEX`` (the
    session's index among its task's samples, e.g. to seed a program per sample),
    ``POLAR_{ANTHROPIC,OPENAI,GOOGLE}_BASE_URL`` and
    the variables the common SDKs read (``OPENAI_BASE_URL``/``OPENAI_API_KEY``, ``ANTHROPIC_BASE_URL``/
    ``ANTHROPIC_API_KEY``, ``GOOGLE_GEMINI_BASE_URL``/``GEMINI_API_KEY``).

    Options:
        argv: The command line (required, a list of strings).
        files: Extra files to write, path relative to ``HOME`` → text.
        log_paths: Paths (absolute, or relative to the workspace) to collect as logs.
    """

    name = "command"
    option_names = HARNESS_OPTIONS["command"]
    artifacts = "whatever options.log_paths names."

    def prepare(self, ctx: HarnessContext) -> HarnessLaunch:
        """Build the launch; see :meth:`gateway.harnesses.base.HarnessAdapter.prepare`."""
        check_options(self.name, ctx.options, self.option_names)
        template = string_list(self.name, "argv", ctx.option("argv"))
        if not template:
            raise InvalidArgument("the command harness needs a non-empty option 'argv'", details={"harness": self.name})
        values = {
            "{instruction}": ctx.instruction,
            "{model}": ctx.model,
            "{workspace}": str(ctx.workspace),
            "{home}": str(ctx.home),
        }
        argv = [_substitute(arg, values) for arg in template]
        argv += string_list(self.name, "extra_args", ctx.option("extra_args"))
        ep = ctx.endpoints
        env = base_environment(ctx, self.name)
        env.update(
            {
                "POLAR_SESSION_TOKEN": ep.token,
                "POLAR_MODEL": ctx.model,
                "POLAR_INSTRUCTION": ctx.instruction,
                "POLAR_WORKSPACE": str(ctx.workspace),
                "POLAR_SESSION_ID": ctx.session_id,
                "POLAR_SAMPLE_INDEX": str(ctx.sample_index),
                "POLAR_ANTHROPIC_BASE_URL": ep.anthropic_base_url,
                "POLAR_OPENAI_BASE_URL": ep.openai_base_url,
                "POLAR_GOOGLE_BASE_URL": ep.google_base_url,
            }
        )
        if ep.openai_base_url:
            env.update({"OPENAI_BASE_URL": with_suffix(ep.openai_base_url, "/v1"), "OPENAI_API_KEY": ep.token})
        if ep.anthropic_base_url:
            env.update(
                {"ANTHROPIC_BASE_URL": without_suffix(ep.anthropic_base_url, "/v1"), "ANTHROPIC_API_KEY": ep.token}
            )
        if ep.google_base_url:
            env.update(
                {"GOOGLE_GEMINI_BASE_URL": without_suffix(ep.google_base_url, "/v1beta"), "GEMINI_API_KEY": ep.token}
            )
        files = ctx.option("files") or {}
        if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            raise InvalidArgument("option 'files' of the command harness must map paths to text")
        logs = string_list(self.name, "log_paths", ctx.option("log_paths"))
        return HarnessLaunch(
            argv=tuple(argv),
            env=finish_environment(env, ctx, self.name),
            cwd=ctx.workspace,
            files=dict(files),
            log_paths=tuple(ctx.workspace / p for p in logs),
        )


def _substitute(arg: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        arg = arg.replace(key, value)
    return arg
