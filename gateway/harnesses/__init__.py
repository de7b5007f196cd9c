"""Harness adapters: how each agent CLI is pointed at the model proxy, kept offline and launched.

See ``docs/harnesses.md`` for what each CLI sends and how it is configured.
"""

from __future__ import annotations

from gateway.harnesses.base import HarnessAdapter, HarnessContext, HarnessLaunch, ProxyEndpoints, rebase_endpoints
from gateway.harnesses.patch import collect_patch, init_workspace, init_workspace_argv, patch_argv
from gateway.harnesses.pi import PROVIDER_MODES
from gateway.harnesses.registry import ADAPTERS, adapter_names, get_adapter

__all__ = [
    "ADAPTERS",
    "PROVIDER_MODES",
    "HarnessAdapter",
    "HarnessContext",
    "HarnessLaunch",
    "ProxyEndpoints",
    "adapter_names",
    "collect_patch",
    "get_adapter",
    "init_workspace",
    "init_workspace_argv",
    "patch_argv",
    "rebase_endpoints",
]
