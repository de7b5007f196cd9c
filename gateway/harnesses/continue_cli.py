"""Continue CLI (``@continuedev/cli``, bin ``cn``): OpenAI Chat Completions through its ``openai`` provider.

Run headless as ``cn -p --config ~/.continue/config.yaml --auto INSTRUCTION`` (``-p`` prints the answer and
exits; ``--auto`` allows every tool, headless Continue otherwise refuses the ones that would ask). The proxy is
the one model of a local assistant config (provider ``openai``, ``apiBase`` = the proxy's ``/v1``), so no
Continue account or hub is involved: with ``--config`` naming a file, the CLI loads it without signing in.
Its OpenTelemetry metrics are off (``CONTINUE_METRICS_ENABLED=0``, ``CONTINUE_CLI_ENABLE_TELEMETRY=0``; they
are sent only when an ``OTEL_EXPORTER_OTLP_*`` endpoint is set anyway), and so is its auto-update
(``autoUpdateCli: false`` in ``~/.continue/index/globalContext.json``).

Its start-up version probe (``GET https://api.continue.dev/cn/info?id=<machine id>``, made with the global
``fetch`` when its bundle loads, in every mode) has no switch in 1.5.47: no variable or setting skips it. So the
adapter preloads a few lines of JavaScript (``NODE_OPTIONS=--require ~/.polar/continue-offline.cjs``, before any
task ``NODE_OPTIONS``) that refuse any ``fetch`` to Continue's own hosts (``continue.dev`` and its subdomains)
before a name is looked up or a socket opened; the CLI takes the refusal as it takes being offline (the probe
returns nothing, a debug line). Requests to anything else, the proxy included, are untouched.

``--verbose`` is refused in ``extra_args``: at debug level ``cn`` logs the whole model entry, ``apiKey`` (the
session token) included, into ``~/.continue/logs/cn.log``, which the gateway keeps. At its default level the log
holds no token (nor do its sessions); the token is only in ``~/.continue/config.yaml``, which is not kept.
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
from polar_checks.harnesses import HARNESS_OPTIONS, check_options
from polar_core.errors import InvalidArgument

__all__ = ["ContinueCliAdapter"]

_CONFIG = ".continue/config.yaml"
_OFFLINE = ".polar/continue-offline.cjs"
# Preloaded into cn (CommonJS, before its ES module bundle): Continue's version probe has no switch.
OFFLINE_JS = """\
"use strict";
// Polar: refuse Continue's own service (its start-up version probe has no switch); nothing else is touched.
const vendor = (host) => host === "continue.dev" || host.endsWith(".continue.dev");
const upstream = globalThis.fetch;
if (typeof upstream === "function") {
  globalThis.fetch = function fetch(input, init) {
    let host = "";
    try {
      host = new URL(typeof input === "string" || input instanceof URL ? input : input.url).hostname;
    } catch {}
    if (vendor(host.toLowerCase())) {
      return Promise.reject(new Error(`polar: no request to ${host}: the harness talks only to the model proxy`));
    }
    return upstream.call(this, input, init);
  };
}
"""


class ContinueCliAdapter:
    """Runs ``cn -p`` once against the proxy's Chat Completions endpoint.

    Options:
        auto: Pass ``--auto`` so every tool is allowed without asking (default true).
        context_window: ``defaultCompletionOptions.contextLength`` of the model (default 128000).
        max_tokens: ``defaultCompletionOptions.maxTokens`` of the model (default 16384).
        format: ``--format`` of headless mode (``json`` prints the answer as a JSON object; default: text).
    """

    name = "continue"
    option_names = HARNESS_OPTIONS["continue"]
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
        argv += self._extra_args(ctx)
        argv += ["--", ctx.instruction]
        env = finish_environment(env, ctx, self.name)
        # The preload first; a task's own NODE_OPTIONS (if any) after it, so it cannot drop the preload by accident.
        preload = f"--require {json.dumps(str(ctx.home / _OFFLINE))}"
        env["NODE_OPTIONS"] = f"{preload} {env['NODE_OPTIONS']}" if env.get("NODE_OPTIONS") else preload
        return HarnessLaunch(
            argv=tuple(argv),
            env=env,
            cwd=ctx.workspace,
            files={
                # JSON is YAML: no YAML writer needed, and no quoting question for model names or URLs.
                _CONFIG: json.dumps(config, indent=2) + "\n",
                ".continue/index/globalContext.json": json.dumps(shared, indent=2) + "\n",
                _OFFLINE: OFFLINE_JS,
            },
            log_paths=(home / "sessions", home / "logs"),
        )

    def _extra_args(self, ctx: HarnessContext) -> list[str]:
        """``extra_args``, without ``--verbose``.

        Raises:
            InvalidArgument: ``--verbose`` is among them (field ``harness.extra_args``): its debug log holds the
                session token, and the gateway keeps that log.
        """
        extra = string_list(self.name, "extra_args", ctx.option("extra_args"))
        if any(arg == "--verbose" or arg.startswith("--verbose=") for arg in extra):
            raise InvalidArgument(
                "harness.extra_args: --verbose is refused for harness 'continue': at debug level cn writes the "
                "session token (the model's apiKey) into ~/.continue/logs/cn.log, which the gateway keeps",
                details={"harness": self.name, "field": "harness.extra_args"},
            )
        return extra

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
