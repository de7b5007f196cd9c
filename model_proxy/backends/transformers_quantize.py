"""The in-process backend's optional reduced-precision Linear layers on CPU (``quantize`` option).

A decoding step of a small model on CPU is bound by memory bandwidth: every token reads every weight. Storing
the Linear layers' weights in fewer bytes speeds it up, at the price of serving a policy that differs from the
float32 one a trainer computes log-probabilities with. Both kinds use ``torch.ao.quantization.quantize_dynamic``
(fbgemm/x86 kernels, CPU only); embeddings, norms and attention stay float32.

* ``"float16"``: weights stored in float16, activations and accumulation in float32. Measured on SmolLM2-135M
  (docs/backends.md): calls about 1.5× faster than float32 on one core, and the sampled tokens'
  log-probabilities differ from float32 teacher forcing by about 0.0015 nats on average (importance ratios
  within 1 %). A token's result does not depend on which other positions share its forward pass, beyond
  float rounding.
* ``"int8"``: weights int8 per tensor, activations quantised to int8 per forward pass with a range taken over
  the whole input, so a token's logits depend on the other positions in its pass (the prefill block). Calls
  1.7-1.8× faster than float32, but on SmolLM2 the sampled tokens' log-probabilities differ from float32 by about
  0.6 nats on average (a different policy), and a full teacher-forced pass with the *same* int8 model differs
  by several nats on some tokens; only replaying the backend's own passes (blocks of ``prefill_block``, then one
  token at a time) reproduces them.

Either way the recorded log-probability is the one the served model gave when it sampled (the decoding loop
samples and records from one forward pass); nothing is recomputed in float32.
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

import torch

from polar_core.errors import InvalidArgument

__all__ = ["QUANTIZE_KINDS", "Quantize", "quantize_model"]

Quantize = Literal["none", "int8", "float16"]
QUANTIZE_KINDS: tuple[Quantize, ...] = ("none", "int8", "float16")


def quantize_model(model: Any, kind: Quantize, *, inplace: bool) -> Any:
    """``model`` with its ``nn.Linear`` layers replaced by ``kind``'s dynamic-quantised ones (``"none"``: as is).

    Args:
        model: A float32 causal LM on CPU.
        kind: ``"none"``, ``"int8"`` or ``"float16"``.
        inplace: Replace the layers of ``model`` itself; otherwise a copy is quantised and ``model`` (which may be
            shared, e.g. the policy's weights the proxy loaded) is left as it was.

    Raises:
        InvalidArgument: An unknown kind, or a model that is not float32 on CPU.
    """
    if kind == "none":
        return model
    if kind not in QUANTIZE_KINDS:
        raise InvalidArgument(f"transformers backend: quantize must be one of {list(QUANTIZE_KINDS)}, not {kind!r}")
    first = next(model.parameters())
    if first.device.type != "cpu" or first.dtype != torch.float32:
        raise InvalidArgument(
            f"transformers backend: quantize {kind!r} needs a float32 model on CPU, not {first.dtype} on "
            f"{first.device} (leave 'device' and 'dtype' unset, or set quantize to 'none')"
        )
    from torch.ao.quantization import default_dynamic_qconfig, float16_dynamic_qconfig, quantize_dynamic

    qconfig = float16_dynamic_qconfig if kind == "float16" else default_dynamic_qconfig
    dtype = torch.float16 if kind == "float16" else torch.qint8
    with warnings.catch_warnings():
        # torch.ao.quantization announces its move to torchao (not installed here); the kernels are unchanged.
        warnings.filterwarnings(
            "ignore", message=r".*torch\.ao\.quantization is deprecated", category=DeprecationWarning
        )
        warnings.filterwarnings("ignore", message=r".*quantized tensor creation functions", category=UserWarning)
        quantized = quantize_dynamic(model, {torch.nn.Linear: qconfig}, dtype=dtype, inplace=inplace)  # type: ignore[no-untyped-call]
    return quantized.eval()
