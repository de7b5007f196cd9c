"""Bridges from other RL trainers to Polar: each module fills in one trainer's rollout hook.

``polar_train.bridges.slime`` is slime's ``--rollout-function-path`` (see ``docs/training.md``, "slime");
``polar_train.bridges.trl`` is TRL's ``GRPOTrainer(rollout_func=...)`` (``docs/training.md``, "TRL");
``polar_train.bridges.verl`` is verl's agent loop ``polar`` (``docs/training.md``, "verl").
Modules here are imported by their trainer by dotted path; this package imports none of them, so importing one
bridge never loads another trainer's dependencies.
"""

from __future__ import annotations

__all__: list[str] = []
