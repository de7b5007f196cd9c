"""Continue CLI (``@continuedev/cli``, bin ``cn``): OpenAI Chat Completions through its ``openai`` provider.

Run headless as ``cn -p --config ~/.continue/config.yaml --auto INSTRUCTION`` (``-p`` prints the answer and
exits; ``--auto`` allows every tool, headless Continue otherwise refuses the ones that would ask). The proxy is
the one model of a local assistant config (provider ``openai``, ``apiBase`` = the proxy's ``/v1``), so no
Continue account or hub is involved: with ``--config`` naming a file, the CLI loads it without signing in.
Its OpenTelemetry metrics are off (``CONTINUE_METRICS_ENABLED=0``, ``CONTINUE_CLI_ENABLE_TELEMETRY=0``; they
are sent only when an ``OTEL_EXPORTER_OTLP_*`` endpoint is set anyway), and so is its auto-update
(``autoUpdateCli: false`` in ``~/.continue/index/globalContext.json``). Its start-up version probe
(``api.continue.dev/cn/info``) has no switch; in a network-less sandbox it fails quietly (a debug log line).
"""

from __future__ import annotations

import json

from gateway.harnesses.base import (
    HarnessContext,
    HarnessLaunch,
    base_environment,
    check_options,
    finish_environment,
    require,
    string_list,
    with_suffix,
)
from polar_core.errors import InvalidArgument

__all__ = ["ContinueCliAdapter"]

_OPTIONS = ("auto", "context_window", "max_tokens", "format")
_CONFIG = ".continue/config.yaml"


class ContinueCliAdapter:
    """Runs ``cn -p`` once against the proxy's Chat Completions endpoint.

    Options:
        auto: Pass ``--auto`` so every tool is allowed without asking (default true).
        context_window: ``defaultCompletionOptions.contextLength`` of the model (default 128000).
        max_tokens: ``defaultCompletionOptions.maxTokens`` of the model (default 16384).
        format: ``--format`` of headless mode (``json`` prints the answer as a JSON object; default: text).
    """

    name = "continue"
    option_names = frozenset(_OPTIONS)
    artifacts = "sessions under $HOME/.continue/sessions and its log in $HOME/.continue/logs/cn.log."

    def prepare(self, ctx: HarnessContext) -> HarnessLaunch:
        """Build the launch; see :meth:`gateway.harnesses.base.HarnessAdapter.prepare`."""
        check_options(self.name, ctx.options, self.option_names)
        config = {
            "name": "polar",
            "version": "1.0.0",
            "schema": "v1",
            "models": [
                {
                    "name": ctx.model,
                    "provider": "openai",
                    "model": ctx.model,
                    "apiBase": with_suffix(require(self.name, ctx.endpoints.openai_base_url, "OpenAI"), "/v1"),
                    "apiKey": ctx.endpoints.token,
                    "roles": ["chat", "edit", "apply"],
                    "capabilities": ["tool_use"],
                    "defaultCompletionOptions": {
                        "contextLength": int(ctx.option("context_window", 128_000)),
                        "maxTokens": int(ctx.option("max_tokens", 16_384)),
                    },
                }
            ],
        }
        shared = {"autoUpdateCli": False, "sharedConfig": {"allowAnonymousTelemetry": False}}
        home = ctx.home / ".continue"
        env = base_environment(ctx, self.name)
        env.update(
            {
                "CONTINUE_GLOBAL_DIR": str(home),
                "CONTINUE_METRICS_ENABLED": "0",
                "CONTINUE_CLI_ENABLE_TELEMETRY": "0",
                "CONTINUE_CLI_DISABLE_COMMIT_SIGNATURE": "1",
            }
        )
        argv = ["cn", "-p", "--config", str(ctx.home / _CONFIG)]
        if ctx.option("auto", True):
            argv.append("--auto")
        if ctx.option("format") is not None:
            argv += ["--format", self._format(ctx.option("format"))]
        argv += string_list(self.name, "extra_args", ctx.option("extra_args"))
        argv += ["--", ctx.instruction]
        return HarnessLaunch(
            argv=tuple(argv),
            env=finish_environment(env, ctx, self.name),
            cwd=ctx.workspace,
            files={
                # JSON is YAML: no YAML writer needed, and no quoting question for model names or URLs.
                _CONFIG: json.dumps(config, indent=2) + "\n",
                ".continue/index/globalContext.json": json.dumps(shared, indent=2) + "\n",
            },
            log_paths=(home / "sessions", home / "logs"),
        )

    def _format(self, value: object) -> str:
        """The ``format`` option, which ``cn`` knows only as ``json``.

        Raises:
            InvalidArgument: Any other value (field ``harness.format``).
        """
        if value != "json":
            raise InvalidArgument(
                f"harness.format: harness {self.name!r} knows only format 'json', not {value!r}",
                details={"harness": self.name, "field": "harness.format"},
            )
        return "json"
