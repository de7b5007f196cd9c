"""Build a backend from its name and options (a task file's ``backend:`` section or ``--backend``).

Options per backend (unknown keys are refused, so typos fail loudly):

============  ==================================================================================================
triton        ``url`` or ``urls`` (gRPC ``host:port``; several make a pool), ``model_name`` (default
              ``tensorrt_llm``), ``decoupled``, ``pad_id``, ``tensor_names`` (``temperature``, ``top_k``,
              ``top_p``, ``seed``), ``output_includes_prompt``, ``timeout_s``
vllm          ``url`` or ``urls``, ``model``, ``api_key``, ``timeout_s``, ``extra_body``
sglang        ``url`` or ``urls``, ``api_key``, ``timeout_s``, ``incremental_stream``, ``extra_sampling``
transformers  ``model_dir``, ``device``, ``dtype``, ``max_context``, ``chunk_size``
scripted      ``script`` (a JSON/JSONL file) or ``turns`` (a list of turn objects), ``sessions`` (session id to a
              file or a list of turns), ``end_of_turn_id`` (default: the tokenizer's EOS ID), ``chunk_size``
============  ==================================================================================================

Every pooled kind also takes ``unhealthy_retry_s`` (see :class:`~model_proxy.backends.pool.BackendPool`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from model_proxy.backends.pool import BackendPool
from model_proxy.backends.scripted import ScriptedBackend, ScriptTurn, TextEncoder, load_script
from model_proxy.ports import Backend
from polar_core.errors import InvalidArgument

__all__ = ["BACKEND_NAMES", "create_backend"]

BACKEND_NAMES = ("triton", "vllm", "sglang", "transformers", "scripted")

_ALLOWED: dict[str, frozenset[str]] = {
    "triton": frozenset(
        {"url", "urls", "model_name", "decoupled", "pad_id", "tensor_names", "output_includes_prompt", "timeout_s"}
    ),
    "vllm": frozenset({"url", "urls", "model", "api_key", "timeout_s", "extra_body"}),
    "sglang": frozenset({"url", "urls", "api_key", "timeout_s", "incremental_stream", "extra_sampling"}),
    "transformers": frozenset({"model_dir", "device", "dtype", "max_context", "chunk_size"}),
    "scripted": frozenset({"script", "turns", "sessions", "end_of_turn_id", "chunk_size"}),
}
_POOLED = ("triton", "vllm", "sglang")


def _urls(name: str, options: Mapping[str, Any]) -> list[str]:
    urls: Any = options.get("urls")
    if urls is None:
        urls = [options["url"]] if "url" in options else []
    if isinstance(urls, str):
        urls = [u.strip() for u in urls.split(",") if u.strip()]
    if not urls or not all(isinstance(u, str) for u in urls):
        raise InvalidArgument(f"backend {name!r} needs 'url' or 'urls'")
    return list(urls)


def _pooled(name: str, options: Mapping[str, Any], make: Callable[[str], Backend]) -> Backend:
    replicas = [make(url) for url in _urls(name, options)]
    if len(replicas) == 1:
        return replicas[0]
    return BackendPool(replicas, unhealthy_retry_s=float(options.get("unhealthy_retry_s", 5.0)))


def _turns(value: Any, what: str) -> list[ScriptTurn]:
    if isinstance(value, str | Path):
        return load_script(value)
    if isinstance(value, Sequence):
        try:
            return [ScriptTurn.from_dict(item) for item in value]
        except (ValueError, TypeError, AttributeError) as exc:
            raise InvalidArgument(f"scripted backend: bad {what}: {exc}") from exc
    raise InvalidArgument(f"scripted backend: {what} must be a file path or a list of turns")


def _scripted(options: Mapping[str, Any], tokenizer: Any) -> Backend:
    end_of_turn_id = options.get("end_of_turn_id")
    if end_of_turn_id is None:
        end_of_turn_id = getattr(tokenizer, "eos_token_id", None)
    if not isinstance(end_of_turn_id, int):
        raise InvalidArgument("scripted backend: set 'end_of_turn_id' (the tokenizer has no EOS ID)")
    if "script" in options and "turns" in options:
        raise InvalidArgument("scripted backend: give 'script' or 'turns', not both")
    default: list[ScriptTurn] = []
    if "script" in options:
        default = _turns(options["script"], "script")
    elif "turns" in options:
        default = _turns(options["turns"], "turns")
    sessions_raw = options.get("sessions") or {}
    if not isinstance(sessions_raw, Mapping):
        raise InvalidArgument("scripted backend: 'sessions' maps session ids to scripts")
    sessions = {str(k): _turns(v, f"script of session {k!r}") for k, v in sessions_raw.items()}
    if not default and not sessions:
        raise InvalidArgument("scripted backend needs 'script', 'turns' or 'sessions'")
    encoder: TextEncoder | None = tokenizer
    return ScriptedBackend(
        default,
        encoder,
        end_of_turn_id=end_of_turn_id,
        sessions=sessions,
        chunk_size=int(options.get("chunk_size", 4)),
    )


def create_backend(name: str, options: Mapping[str, Any], tokenizer: Any) -> Backend:
    """Create (but not start) the backend called ``name``.

    Args:
        name: One of :data:`BACKEND_NAMES`.
        options: The backend's options (see the module docstring).
        tokenizer: The policy model's tokenizer (the scripted backend tokenises text turns with it).

    Returns:
        The backend, or a :class:`BackendPool` when several URLs are given.

    Raises:
        InvalidArgument: Unknown name, unknown option or missing required option.
        ValueError: A script file is malformed.
    """
    if name not in _ALLOWED:
        raise InvalidArgument(f"unknown backend {name!r}; expected one of {', '.join(BACKEND_NAMES)}")
    allowed = _ALLOWED[name] | ({"unhealthy_retry_s"} if name in _POOLED else frozenset())
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise InvalidArgument(f"backend {name!r} has no option(s) {unknown}; known: {sorted(allowed)}")
    timeout_s = float(options.get("timeout_s", 600.0))
    if name == "triton":
        from model_proxy.backends.triton import TritonBackend, TritonTensorNames

        names = TritonTensorNames(**dict(options.get("tensor_names") or {}))
        return _pooled(
            name,
            options,
            lambda url: TritonBackend(
                url,
                str(options.get("model_name", "tensorrt_llm")),
                decoupled=bool(options.get("decoupled", False)),
                pad_id=int(options.get("pad_id", 0)),
                tensor_names=names,
                output_includes_prompt=bool(options.get("output_includes_prompt", False)),
                timeout_s=timeout_s,
            ),
        )
    if name == "vllm":
        from model_proxy.backends.vllm import VLLMBackend

        return _pooled(
            name,
            options,
            lambda url: VLLMBackend(
                url,
                model=options.get("model"),
                api_key=options.get("api_key"),
                timeout_s=timeout_s,
                extra_body=options.get("extra_body"),
            ),
        )
    if name == "sglang":
        from model_proxy.backends.sglang import SGLangBackend

        return _pooled(
            name,
            options,
            lambda url: SGLangBackend(
                url,
                api_key=options.get("api_key"),
                timeout_s=timeout_s,
                incremental_stream=bool(options.get("incremental_stream", False)),
                extra_sampling=options.get("extra_sampling"),
            ),
        )
    if name == "transformers":
        from model_proxy.backends.transformers_backend import TransformersBackend

        if "model_dir" not in options:
            raise InvalidArgument("backend 'transformers' needs 'model_dir'")
        max_context = options.get("max_context")
        return TransformersBackend(
            Path(options["model_dir"]),
            device=options.get("device"),
            dtype=options.get("dtype"),
            max_context=int(max_context) if max_context is not None else None,
            chunk_size=int(options.get("chunk_size", 4)),
        )
    return _scripted(options, tokenizer)
