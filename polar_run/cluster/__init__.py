"""``polar cluster``: a Polar fleet as Slurm jobs, driven by one topology file.

* :mod:`polar_run.cluster.topology`: the topology file (typed, validated, checked against the partition);
* :mod:`polar_run.cluster.scripts`: the sbatch script of each slot (one instance of a role);
* :mod:`polar_run.cluster.state`: the state directory next to the topology (job ids, credentials, logs);
* :mod:`polar_run.cluster.slurm`: the Slurm client commands;
* :mod:`polar_run.cluster.launcher`: ``up``, ``status``, ``scale``, ``logs``, ``supervise``, ``down``;
* :mod:`polar_run.cluster.cli`: the subcommand.
"""

from __future__ import annotations

from polar_run.cluster.launcher import ClusterLauncher, SlotStatus
from polar_run.cluster.topology import ROLES, Topology, load_topology

__all__ = ["ROLES", "ClusterLauncher", "SlotStatus", "Topology", "load_topology"]
