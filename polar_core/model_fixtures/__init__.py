"""Model fixtures for tests: a tiny tokenizer and model (the real default model is :mod:`polar_core.default_model`).

* :func:`build_tiny_tokenizer` trains a byte-level BPE tokenizer with Qwen2.5's ChatML and tool tokens.
* :func:`build_tiny_model` builds a 2-layer random Qwen2 model; :func:`save_tiny_model` and
  :func:`ensure_tiny_model_dir` write both to a directory that vLLM, Triton and ``from_pretrained`` load.
* :func:`generate_with_logprobs` and :func:`teacher_forced_logprobs` are the reference for raw
  log-probabilities.

Nothing here downloads anything.
"""

from __future__ import annotations

from polar_core.model_fixtures.cache import (
    FIXTURE_VERSION,
    MARKER_FILE,
    ensure_tiny_model_dir,
    save_tiny_model,
    tiny_model_build_key,
)
from polar_core.model_fixtures.chat_template import (
    CHATML_TOOLS_TEMPLATE,
    DEFAULT_SYSTEM_PROMPT,
    chat_template_renders_tools,
)
from polar_core.model_fixtures.tiny_model import (
    build_tiny_model,
    generate_with_logprobs,
    teacher_forced_logprobs,
    tiny_model_config,
)
from polar_core.model_fixtures.tokenizer import (
    CONTROL_TOKENS,
    END_OF_TEXT,
    IM_END,
    IM_START,
    SPECIAL_TOKENS,
    build_tiny_tokenizer,
)

__all__ = [
    "CHATML_TOOLS_TEMPLATE",
    "CONTROL_TOKENS",
    "DEFAULT_SYSTEM_PROMPT",
    "END_OF_TEXT",
    "FIXTURE_VERSION",
    "IM_END",
    "IM_START",
    "MARKER_FILE",
    "SPECIAL_TOKENS",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "chat_template_renders_tools",
    "ensure_tiny_model_dir",
    "generate_with_logprobs",
    "save_tiny_model",
    "teacher_forced_logprobs",
    "tiny_model_build_key",
    "tiny_model_config",
]
