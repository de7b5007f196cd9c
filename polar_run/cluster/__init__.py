"""``polar cluster``: a Polar fleet as Slurm jobs, driven by one topology file (``docs/deploy.md``, "Slurm").

* :mod:`polar_run.cluster.topology`: the topology file (typed, validated, checked against the partition);
* :mod:`polar_run.cluster.scripts`: the sbatch script of each slot (one instance of a role);
* :mod:`polar_run.cluster.state`: the state directory next to the topology (job ids, credentials, logs);
* :mod:`polar_run.cluster.slurm`: the Slurm client commands;
* :mod:`polar_run.cluster.launcher`: ``up``, ``status``, ``scale``, ``logs``, ``supervise``, ``down``;
* :mod:`polar_run.cluster.cli`: the subcommand.

The names below load their module on first use, so ``polar`` does not load the launcher for other commands.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from polar_run.cluster.launcher import ClusterLauncher, SlotStatus
    from polar_run.cluster.topology import ROLES, Topology, load_topology

__all__ = ["ROLES", "ClusterLauncher", "SlotStatus", "Topology", "load_topology"]

_MODULE_OF = {
    "ClusterLauncher": "polar_run.cluster.launcher",
    "SlotStatus": "polar_run.cluster.launcher",
    "ROLES": "polar_run.cluster.topology",
    "Topology": "polar_run.cluster.topology",
    "load_topology": "polar_run.cluster.topology",
}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'polar_run.cluster' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
