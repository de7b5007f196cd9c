"""Weight updates of the HTTP backends against in-process fakes of their documented endpoints, and Triton's refusal.

The vLLM fake answers like vLLM 0.32's dev-mode endpoints (``/is_paused``, ``/pause``, ``/collective_rpc``,
``/update_weight_version``, ``/resume``, as recorded in the research notes); the SGLang fake like SGLang's
``/update_weights_from_disk`` (``{"success", "message", "num_paused_requests"}``, 200 or 400). The real vLLM
path runs in ``integration_tests/test_backend_vllm_weights.py``; SGLang has no CPU build that installs here.
Checkpoints are written by hand (``config.json`` and a safetensors header with zero tensors), so no torch.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from model_proxy.backends.checkpoint import compare_checkpoints, read_checkpoint
from model_proxy.backends.sglang import SGLangBackend
from model_proxy.backends.tests.conftest import Serve
from model_proxy.backends.triton import TritonBackend
from model_proxy.backends.vllm import VLLMBackend
from polar_core.errors import FailedPrecondition

CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": 64,
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 4,
    "tie_word_embeddings": False,
}
SHAPES = {"model.embed_tokens.weight": [64, 8], "model.norm.weight": [8], "lm_head.weight": [64, 8]}


def _checkpoint(path: Path, config: dict[str, Any] | None = None, shapes: dict[str, list[int]] | None = None) -> Path:
    """Write ``config.json`` and one safetensors file of zero float32 tensors."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(CONFIG | (config or {})))
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in (SHAPES if shapes is None else shapes).items():
        size = 4
        for d in shape:
            size *= d
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))
    return path


@pytest.fixture
def dirs(tmp_path: Path) -> dict[str, Path]:
    return {
        "served": _checkpoint(tmp_path / "served"),
        "new": _checkpoint(tmp_path / "new"),
        "deeper": _checkpoint(tmp_path / "deeper", {"num_hidden_layers": 2}),
        "reshaped": _checkpoint(tmp_path / "reshaped", shapes=SHAPES | {"model.norm.weight": [9]}),
        "tied_served": _checkpoint(
            tmp_path / "tied_served", {"tie_word_embeddings": True}, {k: v for k, v in SHAPES.items() if "lm" not in k}
        ),
        "tied_new": _checkpoint(
            tmp_path / "tied_new", {"tie_word_embeddings": True}, {k: v for k, v in SHAPES.items() if "lm" not in k}
        ),
    }


# ----- the local pre-flight check -----------------------------------------------------------------------


def test_read_checkpoint_refuses_unreadable_directories(tmp_path: Path) -> None:
    with pytest.raises(FailedPrecondition, match="is not a directory"):
        read_checkpoint(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FailedPrecondition, match=r"no config\.json"):
        read_checkpoint(tmp_path / "empty")
    (tmp_path / "empty" / "config.json").write_text("{not json")
    with pytest.raises(FailedPrecondition, match="cannot read"):
        read_checkpoint(tmp_path / "empty")
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(FailedPrecondition, match=r"no weight files"):
        read_checkpoint(tmp_path / "empty")
    (tmp_path / "empty" / "model.safetensors").write_bytes(b"\x01")
    with pytest.raises(FailedPrecondition, match="safetensors header"):
        read_checkpoint(tmp_path / "empty")


def test_compare_names_every_difference(dirs: dict[str, Path]) -> None:
    served = read_checkpoint(dirs["served"])
    assert served.architecture == "Qwen2ForCausalLM"
    assert not served.tied
    assert compare_checkpoints(served, read_checkpoint(dirs["new"])) == []
    assert compare_checkpoints(served, read_checkpoint(dirs["deeper"])) == ["num_hidden_layers 2 (served: 1)"]
    assert compare_checkpoints(served, read_checkpoint(dirs["reshaped"])) == [
        "tensor model.norm.weight has shape [9] (served: [8])"
    ]
    tied = compare_checkpoints(served, read_checkpoint(dirs["tied_new"]))
    assert tied == ["tie_word_embeddings True (served: False)", "tensor lm_head.weight is missing"]


# ----- vLLM ------------------------------------------------------------------------------------------------


class _Vllm:
    """vLLM's dev-mode endpoints; ``dev_mode`` off answers 404 as vLLM does without VLLM_SERVER_DEV_MODE."""

    def __init__(self, root: Path, *, dev_mode: bool = True, reload_status: int = 200) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.dev_mode = dev_mode
        self.reload_status = reload_status
        self.root = root

    def app(self) -> Starlette:
        async def handle(request: Request) -> Response:
            path = request.url.path
            body = await request.json() if await request.body() else None
            self.calls.append((path if not request.query_params else f"{path}?{request.query_params}", body))
            if path == "/v1/models":
                return JSONResponse({"data": [{"id": "tiny", "root": str(self.root)}]})
            if path == "/health":
                return Response(status_code=200)
            if not self.dev_mode:
                return JSONResponse({"detail": "Not Found"}, status_code=404)
            if path == "/collective_rpc" and self.reload_status != 200:
                message = "Call to collective_rpc method failed: Worker failed with error ''"
                return JSONResponse({"error": {"message": message, "code": 500}}, status_code=self.reload_status)
            answers = {
                "/is_paused": {"is_paused": False},
                "/pause": {"status": "paused"},
                "/collective_rpc": {"results": [None]},
                "/update_weight_version": {"success": True, "new_version": (body or {}).get("new_version")},
                "/resume": {"status": "resumed"},
            }
            return JSONResponse(answers[path])

        return Starlette(routes=[Route("/{path:path}", handle, methods=["GET", "POST"])])

    def posted(self) -> list[str]:
        return [path for path, _ in self.calls if path not in ("/is_paused", "/v1/models", "/health")]


async def _vllm(serve: Serve, fake: _Vllm, model_dir: Path | None = None) -> VLLMBackend:
    backend = VLLMBackend(await serve(fake.app()), model="tiny", model_dir=model_dir)
    await backend.start()
    return backend


async def test_vllm_reloads_between_pause_and_resume(dirs: dict[str, Path], serve: Serve) -> None:
    fake = _Vllm(dirs["served"])
    backend = await _vllm(serve, fake)  # the served directory comes from /v1/models' root
    assert await backend.check_weights(str(dirs["new"])) == "Qwen2ForCausalLM"
    assert fake.posted() == []  # the check sends nothing that changes the server
    await backend.load_weights(str(dirs["new"]))
    assert fake.posted() == ["/pause?mode=wait", "/collective_rpc", "/update_weight_version", "/resume"]
    calls = dict(fake.calls)
    assert calls["/collective_rpc"] == {"method": "reload_weights", "kwargs": {"weights_path": str(dirs["new"])}}
    assert calls["/update_weight_version"] == {"new_version": str(dirs["new"])}
    assert await backend.healthy()
    await backend.close()


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("deeper", r"num_hidden_layers 2 \(served: 1\)"),
        ("reshaped", "tensor model.norm.weight has shape"),
        ("missing", "is not a directory"),
    ],
)
async def test_vllm_refuses_unfit_checkpoints_before_sending_anything(
    dirs: dict[str, Path], tmp_path: Path, name: str, message: str, serve: Serve
) -> None:
    fake = _Vllm(dirs["served"])
    backend = await _vllm(serve, fake, dirs["served"])
    path = dirs.get(name, tmp_path / "missing")
    with pytest.raises(FailedPrecondition, match=message):
        await backend.load_weights(str(path))
    assert fake.posted() == []
    await backend.close()


async def test_vllm_refuses_tied_embeddings(dirs: dict[str, Path], serve: Serve) -> None:
    fake = _Vllm(dirs["tied_served"])
    backend = await _vllm(serve, fake, dirs["tied_served"])
    with pytest.raises(FailedPrecondition, match="cannot reload a tied output layer"):
        await backend.load_weights(str(dirs["tied_new"]))
    assert fake.posted() == []
    await backend.close()


async def test_vllm_without_dev_mode_names_the_variable(dirs: dict[str, Path], serve: Serve) -> None:
    backend = await _vllm(serve, _Vllm(dirs["served"], dev_mode=False), dirs["served"])
    with pytest.raises(FailedPrecondition, match="VLLM_SERVER_DEV_MODE=1"):
        await backend.check_weights(str(dirs["new"]))
    await backend.close()


async def test_vllm_failed_reload_loses_the_replica(dirs: dict[str, Path], serve: Serve) -> None:
    fake = _Vllm(dirs["served"], reload_status=500)
    backend = await _vllm(serve, fake, dirs["served"])
    with pytest.raises(FailedPrecondition, match=r"is lost: reloading .* failed .*500.*restart it"):
        await backend.load_weights(str(dirs["new"]))
    assert fake.posted() == ["/pause?mode=wait", "/collective_rpc"]  # never resumed
    assert not await backend.healthy()
    with pytest.raises(FailedPrecondition, match="is lost"):
        await backend.check_weights(str(dirs["new"]))
    await backend.close()


async def test_vllm_unknown_served_directory(dirs: dict[str, Path], tmp_path: Path, serve: Serve) -> None:
    backend = await _vllm(serve, _Vllm(tmp_path / "elsewhere"))
    with pytest.raises(FailedPrecondition, match="set the backend option 'model_dir'"):
        await backend.check_weights(str(dirs["new"]))
    await backend.close()


# ----- SGLang ----------------------------------------------------------------------------------------------


class _Sglang:
    """SGLang's ``/update_weights_from_disk`` and ``/get_model_info`` (this version has no ``/model_info``)."""

    def __init__(self, root: Path, *, status: int = 200, success: bool = True) -> None:
        self.root = root
        self.status = status
        self.success = success
        self.bodies: list[Any] = []

    def app(self) -> Starlette:
        async def update(request: Request) -> Response:
            body = await request.json()
            self.bodies.append(body)
            if self.status >= 500:
                return Response("Internal Server Error", status_code=self.status)
            if not self.success:
                message = "Failed to update weights: boom.\nRolling back to original weights."
                return JSONResponse({"success": False, "message": message, "num_paused_requests": 0}, status_code=400)
            message = f"Succeeded to update model weights. Weight version updated to {body['weight_version']}."
            return JSONResponse({"success": True, "message": message, "num_paused_requests": 0})

        async def model_info(request: Request) -> Response:
            return JSONResponse({"model_path": str(self.root), "is_generation": True, "weight_version": "default"})

        async def health(request: Request) -> Response:
            return Response(status_code=200)

        return Starlette(
            routes=[
                Route("/update_weights_from_disk", update, methods=["POST"]),
                Route("/get_model_info", model_info),
                Route("/health", health),
            ]
        )


async def _sglang(serve: Serve, fake: _Sglang) -> SGLangBackend:
    backend = SGLangBackend(await serve(fake.app()))
    await backend.start()
    return backend


async def test_sglang_updates_from_disk_with_the_version(dirs: dict[str, Path], serve: Serve) -> None:
    fake = _Sglang(dirs["served"])
    backend = await _sglang(serve, fake)
    assert await backend.check_weights(str(dirs["new"])) == "Qwen2ForCausalLM"
    assert fake.bodies == []
    await backend.load_weights(str(dirs["new"]))
    assert fake.bodies == [
        {"model_path": str(dirs["new"]), "weight_version": str(dirs["new"]), "abort_all_requests": False}
    ]
    assert await backend.healthy()
    await backend.close()


async def test_sglang_refusal_keeps_the_old_weights(dirs: dict[str, Path], serve: Serve) -> None:
    backend = await _sglang(serve, _Sglang(dirs["served"], status=400, success=False))
    with pytest.raises(FailedPrecondition, match=r"(?s)refused .*400.*Rolling back.*keeps serving the old weights"):
        await backend.load_weights(str(dirs["new"]))
    assert await backend.healthy()
    await backend.close()


async def test_sglang_server_error_loses_the_replica(dirs: dict[str, Path], serve: Serve) -> None:
    backend = await _sglang(serve, _Sglang(dirs["served"], status=500))
    with pytest.raises(FailedPrecondition, match="is lost"):
        await backend.load_weights(str(dirs["new"]))
    assert not await backend.healthy()
    await backend.close()


async def test_sglang_refuses_unfit_checkpoints_before_sending(dirs: dict[str, Path], serve: Serve) -> None:
    fake = _Sglang(dirs["served"])
    backend = await _sglang(serve, fake)
    with pytest.raises(FailedPrecondition, match="num_hidden_layers"):
        await backend.load_weights(str(dirs["deeper"]))
    assert fake.bodies == []
    await backend.close()


# ----- Triton ----------------------------------------------------------------------------------------------


async def test_triton_names_what_tensorrt_llm_needs(dirs: dict[str, Path]) -> None:
    backend = TritonBackend("127.0.0.1:1", "tensorrt_llm")
    for method in (backend.check_weights, backend.load_weights):
        with pytest.raises(FailedPrecondition, match="trtllm-build") as info:
            await method(str(dirs["new"]))
        message = info.value.message
        assert "trtllm-refit" in message
        assert "v2/repository/models/tensorrt_llm/load" in message
        assert "gpt_model_path" in message
