"""Inference backends of the model proxy: token IDs in, token IDs and log-probabilities out.

Each implements :class:`~model_proxy.ports.Backend` (re-exported here); :func:`create_backend` builds one from
its name and options, validated into the kind's frozen options model (:mod:`model_proxy.backends.options`);
:data:`BACKENDS` is the registry of kinds by name.

``TritonBackend``, ``TransformersBackend`` and ``LlamaCppBackend`` are imported on first use, so importing this
package needs neither ``tritonclient``, ``torch`` nor ``llama-cpp-cffi``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from model_proxy.backends._llama_cpp_lib import llama_cpp_missing
from model_proxy.backends.factory import BACKEND_NAMES, BACKENDS, BackendKind, create_backend, parse_options
from model_proxy.backends.options import (
    BackendOptions,
    LlamaCppOptions,
    ScriptedOptions,
    SGLangOptions,
    TransformersOptions,
    TritonOptions,
    VLLMOptions,
)
from model_proxy.backends.pool import BackendPool
from model_proxy.backends.scripted import ScriptedBackend, ScriptTurn, load_script
from model_proxy.backends.sglang import SGLangBackend
from model_proxy.backends.vllm import VLLMBackend
from model_proxy.ports import Backend

if TYPE_CHECKING:
    from model_proxy.backends.llama_cpp import LlamaCppBackend
    from model_proxy.backends.transformers_backend import TransformersBackend
    from model_proxy.backends.triton import TritonBackend, TritonTensorNames

__all__ = [
    "BACKENDS",
    "BACKEND_NAMES",
    "Backend",
    "BackendKind",
    "BackendOptions",
    "BackendPool",
    "LlamaCppBackend",
    "LlamaCppOptions",
    "SGLangBackend",
    "SGLangOptions",
    "ScriptTurn",
    "ScriptedBackend",
    "ScriptedOptions",
    "TransformersBackend",
    "TransformersOptions",
    "TritonBackend",
    "TritonOptions",
    "TritonTensorNames",
    "VLLMBackend",
    "VLLMOptions",
    "create_backend",
    "llama_cpp_missing",
    "load_script",
    "parse_options",
]

_LAZY = {
    "LlamaCppBackend": "model_proxy.backends.llama_cpp",
    "TransformersBackend": "model_proxy.backends.transformers_backend",
    "TritonBackend": "model_proxy.backends.triton",
    "TritonTensorNames": "model_proxy.backends.triton",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
