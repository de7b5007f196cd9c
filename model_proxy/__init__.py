"""The model proxy: provider protocols in, token IDs to the backend, completion records captured.

See ``docs/proxy.md``. The modules, in the order a harness's call meets them:

* :mod:`model_proxy.server` serves a :class:`ProxyApp` (:mod:`model_proxy.app`), which builds everything from
  :class:`ProxySettings` and runs the provider HTTP API (:mod:`model_proxy.http`); :mod:`model_proxy.servicer`
  is the thin gRPC layer (sessions, completions, policy version, pause), converting with
  :mod:`model_proxy.convert`.
* :mod:`model_proxy.protocols` translates each provider's wire format (Anthropic, OpenAI Chat and Responses,
  Google) to and from the internal request and result types of :mod:`model_proxy.models`.
* :mod:`model_proxy.core` is the domain (no grpc): :class:`ProxyEngine` renders the prompt, gates, calls the
  :class:`Backend` (the seam in :mod:`model_proxy.ports`), parses the output and records the completion in its
  session (:mod:`model_proxy.core.sessions`).
* :mod:`model_proxy.backends` holds the inference backends (Triton, vLLM, SGLang, transformers, scripted) and
  their typed options; :mod:`model_proxy.errors` the exception tree.
"""

from __future__ import annotations

from model_proxy.app import ProxyApp
from model_proxy.core import ProxyEngine
from model_proxy.models import (
    ChatMessage,
    EngineConfig,
    GenerationChunk,
    GenerationRequest,
    InternalRequest,
    ParsedOutput,
    SamplingParams,
    ToolCall,
    ToolSpec,
)
from model_proxy.ports import Backend
from model_proxy.settings import ProxySettings

__all__ = [
    "Backend",
    "ChatMessage",
    "EngineConfig",
    "GenerationChunk",
    "GenerationRequest",
    "InternalRequest",
    "ParsedOutput",
    "ProxyApp",
    "ProxyEngine",
    "ProxySettings",
    "SamplingParams",
    "ToolCall",
    "ToolSpec",
]
