"""pi (``@mariozechner/pi-coding-agent``, bin ``pi``): any of four provider APIs, run as ``pi -p``."""

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
    without_suffix,
)
from polar_checks.harnesses import HARNESS_OPTIONS, check_options
from polar_core.errors import InvalidArgument

__all__ = ["PROVIDER_MODES", "PiAdapter"]

PROVIDER_MODES = ("openai-completions", "openai-responses", "anthropic-messages", "google-generative-ai")
_PROVIDER = "polar"


class PiAdapter:
    """Runs ``pi --provider polar --model M -p INSTRUCTION`` with a ``models.json`` naming the proxy.

    Options:
        provider_mode: Which of pi's APIs to speak: ``openai-completions`` (default), ``openai-responses``,
            ``anthropic-messages`` or ``google-generative-ai``.
        context_window: ``contextWindow`` of the model entry.
        max_tokens: ``maxTokens`` of the model entry.
    """

    name = "pi"
    option_names = HARNESS_OPTIONS["pi"]
    artifacts = "session transcripts under $HOME/.pi/agent/sessions (JSONL)."

    def _base_url(self, ctx: HarnessContext, mode: str) -> str:
        endpoints = ctx.endpoints
        if mode.startswith("openai-"):
            return with_suffix(require(self.name, endpoints.openai_base_url, "OpenAI"), "/v1")
        if mode == "anthropic-messages":
            # The Anthropic SDK appends /v1/messages to the bare host.
            return without_suffix(require(self.name, endpoints.anthropic_base_url, "Anthropic"), "/v1")
        return with_suffix(require(self.name, endpoints.google_base_url, "Google"), "/v1beta")

    def prepare(self, ctx: HarnessContext) -> HarnessLaunch:
        """Build the launch; see :meth:`gateway.harnesses.base.HarnessAdapter.prepare`."""
        check_options(self.name, ctx.options, self.option_names)
        mode = str(ctx.option("provider_mode", "openai-completions"))
        if mode not in PROVIDER_MODES:
            raise InvalidArgument(
                f"pi option provider_mode must be one of {', '.join(PROVIDER_MODES)}, not {mode!r}",
                details={"harness": self.name},
            )
        model: dict[str, object] = {"id": ctx.model, "name": ctx.model}
        if ctx.option("context_window") is not None:
            model["contextWindow"] = int(ctx.option("context_window"))
        if ctx.option("max_tokens") is not None:
            model["maxTokens"] = int(ctx.option("max_tokens"))
        models = {
            "providers": {
                _PROVIDER: {
                    "baseUrl": self._base_url(ctx, mode),
                    "api": mode,
                    "apiKey": ctx.endpoints.token,
                    "models": [model],
                }
            }
        }
        env = base_environment(ctx, self.name)
        env["PI_OFFLINE"] = "1"
        argv = ["pi", "--provider", _PROVIDER, "--model", ctx.model]
        argv += string_list(self.name, "extra_args", ctx.option("extra_args"))
        argv += ["-p", ctx.instruction]
        return HarnessLaunch(
            argv=tuple(argv),
            env=finish_environment(env, ctx, self.name),
            cwd=ctx.workspace,
            files={".pi/agent/models.json": json.dumps(models, indent=2) + "\n"},
            log_paths=(ctx.home / ".pi" / "agent" / "sessions",),
        )
