"""``polar run`` serves its in-process CPU model with float16 Linear layers unless told otherwise."""

from __future__ import annotations

from typing import Any

import pytest

from polar_run.run import default_backend_options


def test_the_in_process_cpu_model_gets_float16() -> None:
    assert default_backend_options("transformers", {}) == {"quantize": "float16"}
    assert default_backend_options("transformers", {"device": "cpu", "threads": 1}) == {
        "device": "cpu",
        "threads": 1,
        "quantize": "float16",
    }


@pytest.mark.parametrize("kind", ["none", "int8", "float16"])
def test_an_explicit_kind_is_kept(kind: str) -> None:
    assert default_backend_options("transformers", {"quantize": kind}) == {"quantize": kind}


@pytest.mark.parametrize(
    ("backend", "options"),
    [
        ("transformers", {"device": "cuda"}),  # float16 dynamic quantisation is a CPU kernel
        ("transformers", {"dtype": "bfloat16"}),  # it needs float32 weights
        ("vllm", {"url": "http://127.0.0.1:1"}),
        ("scripted", {"turns": []}),
    ],
)
def test_other_backends_and_devices_are_left_alone(backend: str, options: dict[str, Any]) -> None:
    assert default_backend_options(backend, options) == options


def test_the_callers_options_are_not_changed() -> None:
    options: dict[str, Any] = {}
    default_backend_options("transformers", options)
    assert options == {}
