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
              ``chunk_size``, ``prefix_cache``, ``prefill_block``, ``threads``
scripted      ``script`` (a JSON/JSONL file) or ``turns`` (a list of turn objects), ``sessions`` (session id to a
              file or a list of turns), ``end_of_turn_id`` (default: the tokenizer's EOS ID), ``chunk_size``
============  ==================================================================================================

Every pooled kind also takes ``unhealthy_retry_s`` (see :class:`~model_proxy.backends.pool.BackendPool`).
Each kind's options are a frozen model in :mod:`model_proxy.backends.options`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from model_proxy.backends.options import (
    PooledOptions,
    ScriptedOptions,
    SGLangOptions,
    TransformersOptions,
    TritonOptions,
    VLLMOptions,
    parse_options,
)
from model_proxy.backends.pool import BackendPool
from model_proxy.backends.scripted import ScriptedBackend, ScriptTurn, TextEncoder, load_script
from model_proxy.ports import Backend
from polar_core.errors import InvalidArgument

__all__ = ["BACKEND_NAMES", "create_backend"]

BACKEND_NAMES = ("triton", "vllm", "sglang", "transformers", "scripted")


def _pooled(name: str, options: PooledOptions, make: Callable[[str], Backend]) -> Backend:
    replicas = [make(url) for url in options.url_list(name)]
    if len(replicas) == 1:
        return replicas[0]
    return BackendPool(replicas, unhealthy_retry_s=options.unhealthy_retry_s)


def _triton(options: TritonOptions) -> Backend:
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


def _vllm(options: VLLMOptions) -> Backend:
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


def _sglang(options: SGLangOptions) -> Backend:
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


def _transformers(options: TransformersOptions, weights: Any | None) -> Backend:
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


def _scripted(options: ScriptedOptions, tokenizer: Any) -> Backend:
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
    parsed = parse_options(name, options)
    if isinstance(parsed, TritonOptions):
        return _triton(parsed)
    if isinstance(parsed, VLLMOptions):
        return _vllm(parsed)
    if isinstance(parsed, SGLangOptions):
        return _sglang(parsed)
    if isinstance(parsed, TransformersOptions):
        return _transformers(parsed, weights)
    assert isinstance(parsed, ScriptedOptions)
    return _scripted(parsed, tokenizer)
