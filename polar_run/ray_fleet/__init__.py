"""Gateways on a trainer's running Ray cluster (the ``ray`` extra: ``pip install 'polar-rollout[ray]'``).

* :func:`start_fleet` (:mod:`polar_run.ray_fleet.fleet`) places gateway actors on the cluster's nodes by a
  spread rule (:mod:`polar_run.ray_fleet.placement`), waits until each registered with the rollout server and
  returns a :class:`RayFleet`, whose supervisor replaces a gateway whose node dies;
* :mod:`polar_run.ray_fleet.actor` is one gateway as an actor (the real GatewayService in the worker process).

docs/deploy.md ("Ray") shows a complete example. ``import polar_run`` never imports Ray; the names below load
their module (and Ray) on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from polar_run.ray_fleet.fleet import FleetMember, RayFleet, alive_nodes, start_fleet
    from polar_run.ray_fleet.placement import NodeView, Sizing, place

__all__ = ["FleetMember", "NodeView", "RayFleet", "Sizing", "alive_nodes", "place", "start_fleet"]

_MODULES = {
    "polar_run.ray_fleet.fleet": ("FleetMember", "RayFleet", "alive_nodes", "start_fleet"),
    "polar_run.ray_fleet.placement": ("NodeView", "Sizing", "place"),
}
_MODULE_OF = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'polar_run.ray_fleet' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
