"""Llama (HF `LlamaForCausalLM`: SmolLM2, Llama 3) and its config.json conversion (`model_type`
'llama').

The shared decoder stack (`models/decoder.py`) with only full-attention layers, plain x̂·w
RMSNorms, no q/k norms, no attention output gate, RoPE over the whole head_dim (split-half, as
HF rotates it), optionally scaled for long contexts (`rope_parameters`: 'linear' or 'llama3').
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from intraskill_jax.models.config import ModelConfig, hf_text_dict, hf_text_fields
from intraskill_jax.models.decoder import Architecture, CausalLM

NAME = "llama"
MODEL_TYPE = "llama"

ARCHITECTURE = Architecture(zero_centered_norm=False, attn_output_gate=False, qk_norm=False)


class LlamaForCausalLM(CausalLM):
    """Llama text model with LM head (tied to the embedding in SmolLM2); paths equal HF keys."""

    family = NAME
    architecture = ARCHITECTURE


def fields_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    """`ModelConfig` fields of a `llama` config.json."""
    fields = hf_text_fields(hf, hf, model_type=MODEL_TYPE, partial_rotary_factor=1.0)
    fields["layer_types"] = ("full_attention",) * fields["num_hidden_layers"]
    fields["mlp_bias"] = bool(hf.get("mlp_bias", False))
    return fields


def to_hf(config: ModelConfig) -> dict[str, Any]:
    """The `llama` config.json of `config` (what `LlamaForCausalLM` saves)."""
    out = hf_text_dict(config)
    del out["layer_types"]  # Llama has one layer type
    out["mlp_bias"] = config.mlp_bias
    return out
