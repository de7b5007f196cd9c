"""``polar run`` serves the default policy through llama.cpp unless something names the backend."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml
from rich.console import Console

import model_proxy.backends
from polar_run.run import default_workers, serving_backend
from polar_run.run_config import RunOverrides, prepare_task


def _task(tmp: Path, **fields: object) -> Path:
    data: dict[str, object] = {
        "task_id": "t1",
        "instruction": "Fix it.",
        "harness": {"name": "command", "argv": ["true"]},
        "evaluator": {"strategy": "session_completed"},
    }
    data.update(fields)
    path = tmp / "task.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def llama_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_proxy.backends, "llama_cpp_missing", lambda: None)


@pytest.mark.usefixtures("llama_available")
def test_an_unnamed_backend_is_served_by_llama_cpp(tmp_path: Path) -> None:
    prepared = prepare_task(_task(tmp_path))
    assert prepared.backend == "transformers"
    assert not prepared.backend_named
    served = serving_backend(prepared, "smollm2")
    assert (served.backend, served.backend_options) == ("llama_cpp", {})
    assert served.task == prepared.task  # the gateway's view (model_name) is unchanged


@pytest.mark.usefixtures("llama_available")
@pytest.mark.parametrize(
    ("fields", "overrides"),
    [
        ({"backend": {"name": "transformers"}}, RunOverrides()),
        ({}, RunOverrides(backend="transformers")),
        ({}, RunOverrides(backend_options={"quantize": "none"})),
        ({"backend": {"quantize": "int8"}}, RunOverrides()),
    ],
)
def test_a_named_backend_or_option_is_kept(tmp_path: Path, fields: dict[str, object], overrides: RunOverrides) -> None:
    prepared = prepare_task(_task(tmp_path, **fields), overrides)
    assert prepared.backend_named
    assert serving_backend(prepared, "smollm2") is prepared


@pytest.mark.usefixtures("llama_available")
def test_a_model_name_alone_does_not_name_the_backend(tmp_path: Path) -> None:
    prepared = prepare_task(_task(tmp_path, backend={"model_name": "gpt-x"}))
    assert not prepared.backend_named
    assert serving_backend(prepared, "smollm2").backend == "llama_cpp"


@pytest.mark.usefixtures("llama_available")
def test_other_policies_keep_transformers(tmp_path: Path) -> None:
    # The GGUF is SmolLM2's: another policy (the tiny test model, a checkpoint directory) is never served from it.
    prepared = prepare_task(_task(tmp_path))
    assert serving_backend(prepared, "tiny") is prepared
    assert serving_backend(prepared, str(tmp_path)) is prepared


def test_without_llama_cpp_it_says_so_and_keeps_transformers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_proxy.backends, "llama_cpp_missing", lambda: "llama-cpp-cffi is not installed")
    out = io.StringIO()
    prepared = prepare_task(_task(tmp_path))
    served = serving_backend(prepared, "smollm2", Console(file=out, width=200))
    assert served is prepared
    assert "llama-cpp-cffi is not installed" in out.getvalue()
    assert "transformers" in out.getvalue()


@pytest.mark.parametrize(("backend", "workers"), [("llama_cpp", 1), ("transformers", 1), ("vllm", 4), ("scripted", 4)])
def test_in_process_backends_run_one_harness_at_a_time(backend: str, workers: int) -> None:
    assert default_workers(backend, None) == workers
    assert default_workers(backend, 3) == 3
