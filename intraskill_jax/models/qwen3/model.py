"""Qwen3 dense (HF `Qwen3ForCausalLM`) and its config.json conversion (`model_type` 'qwen3').

The shared decoder stack (`models/decoder.py`) with only full-attention layers, plain x̂·w
RMSNorms (q/k norms included), no attention output gate and RoPE over the whole head_dim.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from intraskill_jax.models.config import ModelConfig, hf_text_dict, hf_text_fields
from intraskill_jax.models.decoder import Architecture, CausalLM

NAME = "qwen3"
MODEL_TYPE = "qwen3"

ARCHITECTURE = Architecture(zero_centered_norm=False, attn_output_gate=False)


class Qwen3ForCausalLM(CausalLM):
    """Qwen3 dense text model with LM head; parameter paths equal HF keys."""

    family = NAME
    architecture = ARCHITECTURE


def fields_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    """`ModelConfig` fields of a `qwen3` config.json."""
    layer_types = hf.get("layer_types")
    if layer_types and any(t != "full_attention" for t in layer_types):
        raise ValueError(
            "Qwen3 layer_types other than 'full_attention' (sliding) are not supported."
        )
    fields = hf_text_fields(hf, hf, model_type=MODEL_TYPE, partial_rotary_factor=1.0)
    fields["layer_types"] = ("full_attention",) * fields["num_hidden_layers"]
    return fields


def to_hf(config: ModelConfig) -> dict[str, Any]:
    """The `qwen3` config.json of `config`."""
    return hf_text_dict(config)
