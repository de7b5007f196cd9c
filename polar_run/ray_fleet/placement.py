"""Where a Ray fleet's gateways go: how many a node holds, and which nodes get the next ones (pure, no Ray).

A node offers *slots*: ``per_node`` gateways, or one per ``cores_per_gateway`` of its CPUs (at least one, so a
node with few cores still serves). The fleet's size is the slots of the nodes alive at start, unless given.
Each new gateway goes to the node with the most free slots, then the one with the fewest gateways, then by node
id (spread, deterministic). When every slot is taken (a node died and its gateways must be replaced), the rule
still holds with negative free slots: the survivors share the extra gateways evenly, so the count is kept.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from polar_core.errors import InvalidArgument

__all__ = ["NodeView", "Sizing", "place"]


@dataclasses.dataclass(frozen=True, slots=True)
class NodeView:
    """An alive Ray node as placement sees it.

    Attributes:
        node_id: Ray's node id (hex).
        ip: The node's address as Ray knows it; gateways bind and advertise it.
        cpus: The node's ``CPU`` resource.
    """

    node_id: str
    ip: str
    cpus: float


@dataclasses.dataclass(frozen=True, slots=True)
class Sizing:
    """How many gateways a node holds: ``per_node``, or one per ``cores_per_gateway`` CPUs when that is set.

    Raises:
        InvalidArgument: ``per_node`` < 1 or ``cores_per_gateway`` <= 0.
    """

    per_node: int = 1
    cores_per_gateway: float | None = None

    def __post_init__(self) -> None:
        if self.per_node < 1:
            raise InvalidArgument(f"per_node must be at least 1, not {self.per_node}")
        if self.cores_per_gateway is not None and not self.cores_per_gateway > 0:
            raise InvalidArgument(f"cores_per_gateway must be positive, not {self.cores_per_gateway}")

    def slots(self, node: NodeView) -> int:
        """Gateways ``node`` holds."""
        if self.cores_per_gateway is None:
            return self.per_node
        return max(1, math.floor(node.cpus / self.cores_per_gateway + 1e-9))

    def total(self, nodes: Iterable[NodeView]) -> int:
        """Gateways all of ``nodes`` hold together."""
        return sum(self.slots(node) for node in nodes)


def place(nodes: Sequence[NodeView], current: Mapping[str, int], count: int, sizing: Sizing) -> list[str]:
    """The node ids for ``count`` new gateways, given ``current`` gateways per node id (see the module's rule).

    Raises:
        InvalidArgument: ``count`` > 0 and no node is alive.
    """
    if count <= 0:
        return []
    if not nodes:
        raise InvalidArgument("no Ray node is alive to place gateways on")
    held = Counter({node.node_id: current.get(node.node_id, 0) for node in nodes})
    chosen: list[str] = []
    for _ in range(count):
        best = min(nodes, key=lambda n: (held[n.node_id] - sizing.slots(n), held[n.node_id], n.node_id))
        held[best.node_id] += 1
        chosen.append(best.node_id)
    return chosen
