"""The Ray fleet's placement rule (pure: no Ray, no ports) and the promise that ``import polar_run`` loads no Ray."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from polar_core.errors import InvalidArgument
from polar_run.ray_fleet.placement import NodeView, Sizing, place

_ROOT = Path(__file__).resolve().parents[2]
A, B, C = NodeView("a", "10.0.0.1", 8.0), NodeView("b", "10.0.0.2", 4.0), NodeView("c", "10.0.0.3", 1.0)


def test_one_per_node_spreads_over_every_node() -> None:
    sizing = Sizing(per_node=1)
    assert sizing.total([A, B, C]) == 3
    assert sorted(place([A, B, C], {}, 3, sizing)) == ["a", "b", "c"]


def test_per_cores_sizes_each_node_by_its_cpus_and_fills_the_freest_first() -> None:
    sizing = Sizing(cores_per_gateway=2)
    assert [sizing.slots(n) for n in (A, B, C)] == [4, 2, 1]  # a 1-core node still holds one
    assert sizing.total([A, B, C]) == 7
    chosen = place([A, B, C], {}, 7, sizing)
    assert {n: chosen.count(n) for n in "abc"} == {"a": 4, "b": 2, "c": 1}
    assert chosen[:3] == ["a", "a", "b"]  # most free slots first, then fewest gateways, then node id


def test_replacements_go_to_free_slots_then_share_the_excess_evenly() -> None:
    sizing = Sizing(per_node=2)
    # Node "c" died with its two gateways: the survivors are full, so the two replacements are split.
    assert sorted(place([A, B], {"a": 2, "b": 2}, 2, sizing)) == ["a", "b"]
    # A node with a free slot takes the replacement first.
    assert place([A, B], {"a": 2, "b": 1}, 1, sizing) == ["b"]


def test_bad_sizing_and_no_node_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="per_node"):
        Sizing(per_node=0)
    with pytest.raises(InvalidArgument, match="cores_per_gateway"):
        Sizing(cores_per_gateway=0)
    with pytest.raises(InvalidArgument, match="no Ray node"):
        place([], {}, 1, Sizing())
    assert place([], {}, 0, Sizing()) == []


def test_importing_polar_run_and_the_placement_rule_loads_no_ray() -> None:
    code = "import sys, polar_run, polar_run.ray_fleet, polar_run.ray_fleet.placement; print('ray' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120, cwd=_ROOT
    )
    assert out.stdout.strip() == "False"
