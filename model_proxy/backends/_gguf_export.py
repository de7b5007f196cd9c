"""A Hugging Face Llama checkpoint re-exported to GGUF, for the ``llama_cpp`` backend's weight updates.

The served GGUF is the template: every metadata key (architecture, hyper-parameters, tokenizer, chat template)
is copied from it with the ``gguf`` package, so the exported file tokenises and behaves as the served one; only
the tensors come from the checkpoint, under llama.cpp's names, matrices as float16 and norms as float32 (what
``convert_hf_to_gguf.py --outtype f16`` writes). ``q_proj`` and ``k_proj`` are permuted as that script's
``LlamaModel.permute`` does (llama.cpp's rotary embedding pairs neighbouring dimensions, Hugging Face's the two
halves of each head). The checkpoint is checked first against what the template describes, from headers alone
(:mod:`model_proxy.backends.checkpoint`): names, shapes, and the config's sizes.

The export is not re-quantised: a trained checkpoint is served in float16, exact to ~0.002 nats of the float32
weights, at the price of a slower decode than the shipped Q4_1 file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from model_proxy.backends.checkpoint import (
    CheckpointInfo,
    TensorSpec,
    compare_config,
    compare_tensors,
    read_checkpoint,
    refusal,
)

__all__ = ["GgufTemplate", "export_checkpoint", "read_template"]

_BLOCK = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
_GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)\.weight$")
_NOT_COPIED = ("GGUF.", "general.architecture", "general.file_type", "general.quantization_version")


def gguf_name(hf_name: str) -> str | None:
    """llama.cpp's name for a Hugging Face Llama tensor, or None for one it has no place for."""
    match = _LAYER.match(hf_name)
    if match:
        part = _BLOCK.get(match.group(2))
        return f"blk.{match.group(1)}.{part}.weight" if part else None
    stem = hf_name.removesuffix(".weight")
    return f"{_GLOBAL[stem]}.weight" if stem != hf_name and stem in _GLOBAL else None


class GgufTemplate:
    """What a served GGUF says a checkpoint must hold.

    Attributes:
        path: The GGUF file.
        architecture: ``general.architecture`` (``llama``).
        config: The ``config.json`` sizes it implies (:data:`~model_proxy.backends.checkpoint.ARCHITECTURE_KEYS`).
        tensors: Hugging Face tensor name to shape (dtype ``F32``: any float fits).
        aliases: ``lm_head.weight`` when the output layer is tied to the embedding.
        heads: Attention heads and key/value heads.
    """

    def __init__(self, path: Path, architecture: str, config: dict[str, Any], tensors: dict[str, TensorSpec]) -> None:
        self.path = path
        self.architecture = architecture
        self.config = config
        self.tensors = tensors
        self.aliases = frozenset() if "lm_head.weight" in tensors else frozenset({"lm_head.weight"})
        self.heads = (int(config["num_attention_heads"]), int(config["num_key_value_heads"]))

    def check(self, path: str) -> CheckpointInfo:
        """Read checkpoint ``path``'s headers and config and check them against this template.

        Raises:
            FailedPrecondition: Unreadable, another architecture or size, tensors missing, extra or misshapen.
        """
        candidate = read_checkpoint(path)
        problems = []
        if candidate.config.get("model_type") not in (None, self.architecture):
            problems.append(f"model_type {candidate.config.get('model_type')!r} (served: {self.architecture!r})")
        problems += compare_config(self.config, candidate.config)
        problems += compare_tensors(self.tensors, candidate.tensors, aliases=self.aliases)
        if problems:
            raise refusal(path, "the served GGUF", problems)
        return candidate


def read_template(path: Path) -> GgufTemplate:
    """Describe the GGUF file ``path`` (metadata and tensor headers only; the file is memory-mapped).

    Raises:
        ValueError: Not a GGUF of a Llama-type model with the expected keys.
    """
    from gguf import GGUFReader

    reader = GGUFReader(path)
    arch = str(reader.fields["general.architecture"].contents())

    def value(key: str) -> int:
        return int(reader.fields[f"{arch}.{key}"].contents())

    tensors: dict[str, TensorSpec] = {}
    names = {t.name: t for t in reader.tensors}
    inverse = {}
    for layer in range(value("block_count")):
        for hf, part in _BLOCK.items():
            inverse[f"blk.{layer}.{part}.weight"] = f"model.layers.{layer}.{hf}.weight"
    inverse.update({f"{g}.weight": f"{h}.weight" for h, g in _GLOBAL.items()})
    for name, tensor in names.items():
        if name not in inverse:
            raise ValueError(f"{path}: tensor {name} has no Hugging Face Llama name")
        tensors[inverse[name]] = TensorSpec(tuple(int(d) for d in reversed(tensor.shape)), "F32")
    vocab = int(names["token_embd.weight"].shape[1])
    config = {
        "vocab_size": vocab,
        "hidden_size": value("embedding_length"),
        "intermediate_size": value("feed_forward_length"),
        "num_hidden_layers": value("block_count"),
        "num_attention_heads": value("attention.head_count"),
        "num_key_value_heads": value("attention.head_count_kv"),
        "tie_word_embeddings": "output.weight" not in names,
    }
    return GgufTemplate(path, arch, config, tensors)


def _permute(weights: np.ndarray[Any, Any], n_head: int) -> np.ndarray[Any, Any]:
    """``convert_hf_to_gguf.py``'s ``LlamaModel.permute`` (``n_head``: the key/value heads for ``k_proj``)."""
    shape = weights.shape
    return weights.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def export_checkpoint(template: GgufTemplate, checkpoint: CheckpointInfo, out: Path) -> None:
    """Write ``checkpoint``'s tensors with ``template``'s metadata as the GGUF file ``out``.

    Raises:
        OSError: A file cannot be read or written.
        ValueError: A tensor cannot be converted.
    """
    from gguf import GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType
    from safetensors import safe_open

    reader = GGUFReader(template.path)
    writer = GGUFWriter(out, template.architecture)
    for field in reader.fields.values():
        if field.name.startswith(_NOT_COPIED):
            continue
        kind = field.types[0]
        writer.add_key_value(
            field.name, field.contents(), kind, sub_type=field.types[-1] if kind == GGUFValueType.ARRAY else None
        )
    writer.add_file_type(LlamaFileType.MOSTLY_F16)
    n_head, n_head_kv = template.heads
    files = sorted(checkpoint.path.glob("*.safetensors"))
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                target = gguf_name(name)
                if target is None or name in template.aliases:
                    continue  # a tied lm_head: llama.cpp reads the embedding
                array = handle.get_tensor(name).float().numpy()
                if name.endswith("q_proj.weight"):
                    array = _permute(array, n_head)
                elif name.endswith("k_proj.weight"):
                    array = _permute(array, n_head_kv)
                array = np.ascontiguousarray(array.astype(np.float16 if array.ndim == 2 else np.float32))
                writer.add_tensor(target, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
