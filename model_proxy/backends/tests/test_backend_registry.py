"""The backend registry: the names contracts.md promises, each with its options model and builder."""

from __future__ import annotations

import pytest

from model_proxy.backends import BACKEND_NAMES, BACKENDS, ScriptedBackend, ScriptedOptions, create_backend
from polar_core.errors import InvalidArgument


def test_the_promised_backend_names_are_registered_in_order() -> None:
    assert BACKEND_NAMES[:5] == ("triton", "vllm", "sglang", "transformers", "scripted")
    assert tuple(BACKENDS) == BACKEND_NAMES
    assert BACKENDS["scripted"].options is ScriptedOptions


def test_an_unknown_backend_is_refused_listing_the_known_ones() -> None:
    with pytest.raises(InvalidArgument, match="unknown backend 'nope'; known: triton, vllm, sglang, transformers"):
        create_backend("nope", {}, None)


def test_a_backend_is_built_by_its_registered_builder_from_validated_options() -> None:
    backend = create_backend("scripted", {"turns": [{"token_ids": [1, 2]}], "end_of_turn_id": 2}, None)
    assert isinstance(backend, ScriptedBackend)
    with pytest.raises(InvalidArgument, match="has no option"):
        create_backend("scripted", {"turns": [{"token_ids": [1]}], "end_of_turn_id": 2, "tunrs": 1}, None)
