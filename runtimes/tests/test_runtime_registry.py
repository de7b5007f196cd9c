"""The runtime registry: one builder per kind, and the kinds are the contract's ``RuntimeKind`` values."""

from __future__ import annotations

from pathlib import Path

from polar_core.convert import RUNTIME_KIND_VALUES, RUNTIME_KINDS
from runtimes import RuntimeKind, RuntimeSpec, create_runtime
from runtimes.factory import RUNTIMES
from runtimes.local import LocalRuntime


def test_every_kind_of_the_contract_has_a_builder() -> None:
    # task.proto's RuntimeKind (read by polar_core.convert) == runtimes.RuntimeKind == the registry.
    assert set(RUNTIME_KINDS.values()) == {kind.value for kind in RuntimeKind} == set(RUNTIMES)
    assert {"local": 1, "docker": 2, "apptainer": 3}.items() <= RUNTIME_KIND_VALUES.items()


def test_create_runtime_uses_the_builder_of_the_spec_kind(tmp_path: Path) -> None:
    runtime = create_runtime(RuntimeSpec(kind=RuntimeKind.LOCAL), session_id="s1", base_dir=tmp_path)
    assert isinstance(runtime, LocalRuntime)
