"""Polar's applications that combine the services, above them: the ``polar`` command and the embedded stack.

* :class:`EmbeddedStack` (:mod:`polar_run.embedded`) starts all five services in one process;
* ``polar run`` (:mod:`polar_run.run`: one task file to a run directory) and ``polar generate``
  (:mod:`polar_run.run_generate` over :mod:`polar_run.dataset`: a dataset to SFT records) run on it, with
  :mod:`polar_run.run_config` (task files and overrides), :mod:`polar_run.run_output` (the run directory) and
  :mod:`polar_run.progress` (the live table);
* ``polar serve`` (:mod:`polar_run.serve`) starts services by name and wires them to each other;
* :mod:`polar_run.cli` is the ``polar`` entry point, :mod:`polar_run.commands` its ``submit``/``status``/
  ``run``/``generate`` subcommands.

The names below load their module on first use, so ``polar serve proxy`` imports only what it needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from polar_run.embedded import EmbeddedStack, StackOptions, end_of_turn_ids
    from polar_run.run import RunOptions, RunReport, run_command, run_task
    from polar_run.run_config import PreparedTask, RunOverrides, prepare_task
    from polar_run.run_generate import GenerateOptions, generate, generate_command
    from polar_run.serve import SERVICE_NAMES, ServeOptions, ServiceSpec, serve, service_spec

__all__ = [
    "SERVICE_NAMES",
    "EmbeddedStack",
    "GenerateOptions",
    "PreparedTask",
    "RunOptions",
    "RunOverrides",
    "RunReport",
    "ServeOptions",
    "ServiceSpec",
    "StackOptions",
    "end_of_turn_ids",
    "generate",
    "generate_command",
    "prepare_task",
    "run_command",
    "run_task",
    "serve",
    "service_spec",
]

_MODULES = {
    "polar_run.embedded": ("EmbeddedStack", "StackOptions", "end_of_turn_ids"),
    "polar_run.run": ("RunOptions", "RunReport", "run_command", "run_task"),
    "polar_run.run_config": ("PreparedTask", "RunOverrides", "prepare_task"),
    "polar_run.run_generate": ("GenerateOptions", "generate", "generate_command"),
    "polar_run.serve": ("SERVICE_NAMES", "ServeOptions", "ServiceSpec", "serve", "service_spec"),
}
_MODULE_OF = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'polar_run' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
