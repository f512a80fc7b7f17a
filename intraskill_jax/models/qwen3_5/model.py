"""Qwen3.5 text model (HF `Qwen3_5ForCausalLM`): Gated DeltaNet + gated attention hybrid.

The shared decoder stack (`models/decoder.py`) with zero-centred x̂·(1 + w) norms, the attention
output gate, RoPE over a quarter of head_dim (`partial_rotary_factor`), and every fourth layer full
attention, the others the Gated DeltaNet below. Also the family's config.json conversion: the
multimodal `qwen3_5` layout (`Qwen3_5ForConditionalGeneration`, the text model under
`text_config`, the vision tower ignored) and the text-only `qwen3_5_text`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from intraskill_jax.models import gated_delta
from intraskill_jax.models.cache import DeltaNetCache
from intraskill_jax.models.config import (
    LINEAR_ATTENTION_FIELDS,
    ModelConfig,
    hf_field,
    hf_text_dict,
    hf_text_fields,
    layer_pattern,
)
from intraskill_jax.models.decoder import Architecture, CausalLM
from intraskill_jax.models.layers import GatedRMSNorm, Linear, constrain, param

logger = logging.getLogger(__name__)

NAME = "qwen3_5"
TEXT_MODEL_TYPE = "qwen3_5_text"
WRAPPER_MODEL_TYPE = "qwen3_5"


class DepthwiseConv1d(nnx.Module):
    """Holds the DeltaNet conv weight in torch layout [C, 1, K] (no bias)."""

    def __init__(self, channels: int, kernel: int, *, param_dtype: jnp.dtype, rngs: nnx.Rngs):
        bound = kernel**-0.5  # torch Conv1d default: fan_in = in_channels/groups · K = K
        w = jax.random.uniform(rngs.params(), (channels, 1, kernel), param_dtype, -bound, bound)
        self.weight = param(w, ("linear_qkv", None, "conv_kernel"))


class GatedDeltaNet(nnx.Module):
    """Qwen3.5 linear-attention mixer. x [B, T, h] -> [B, T, h].

    1. Padded positions of x are zeroed; the conv skips them (see `causal_conv1d`).
    2. mixed = in_proj_qkv(x) [B, T, C]; z = in_proj_z(x) [B, T, Hv, Dv]; b, a = in_proj_b/a(x) [B, T, Hv].
    3. mixed <- silu(causal depthwise conv(mixed)), split into q, k [B, T, Hk, Dk] and v [B, T, Hv, Dv].
    4. β = sigmoid(b); g = −exp(A_log) · softplus(a + dt_bias) (float32). At padded positions
       β = g = 0, so they neither write nor decay the state: masked tokens anywhere are exact
       no-ops for the real ones.
    5. Gated delta rule (chunked; recurrent for one-token decode) -> o [B, T, Hv, Dv].
    6. out_proj(GatedRMSNorm(o, z) flattened to Hv·Dv).
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        c = config
        self.num_k_heads, self.num_v_heads = c.linear_num_key_heads, c.linear_num_value_heads
        self.head_k_dim, self.head_v_dim = c.linear_key_head_dim, c.linear_value_head_dim
        self.chunk_size = c.gdn_chunk_size
        key_dim, value_dim = self.num_k_heads * self.head_k_dim, self.num_v_heads * self.head_v_dim
        kw = {
            "dtype": c.compute_dtype,
            "param_dtype": c.params_dtype,
            "init_std": c.initializer_range,
            "rngs": rngs,
        }
        self.in_proj_qkv = Linear(
            c.hidden_size, 2 * key_dim + value_dim, axes=("linear_qkv", "embed"), **kw
        )
        self.in_proj_z = Linear(c.hidden_size, value_dim, axes=("linear_z", "embed"), **kw)
        self.in_proj_b = Linear(
            c.hidden_size, self.num_v_heads, axes=("linear_heads", "embed"), **kw
        )
        self.in_proj_a = Linear(
            c.hidden_size, self.num_v_heads, axes=("linear_heads", "embed"), **kw
        )
        self.conv1d = DepthwiseConv1d(
            2 * key_dim + value_dim, c.linear_conv_kernel_dim, param_dtype=c.params_dtype, rngs=rngs
        )
        a_init = jax.random.uniform(rngs.params(), (self.num_v_heads,), jnp.float32, 1.0, 16.0)
        self.A_log = param(jnp.log(a_init).astype(c.params_dtype), ("linear_heads",))
        self.dt_bias = param(jnp.ones((self.num_v_heads,), c.params_dtype), ("linear_heads",))
        self.norm = GatedRMSNorm(self.head_v_dim, eps=c.rms_norm_eps, param_dtype=c.params_dtype)
        self.out_proj = Linear(value_dim, c.hidden_size, axes=("embed", "linear_z"), **kw)

    def __call__(
        self,
        x: jax.Array,
        token_mask: jax.Array,
        state: DeltaNetCache | None = None,
        *,
        has_padding: bool = True,
    ) -> tuple[jax.Array, DeltaNetCache | None]:
        """x [B, T, h]; token_mask [B, T] bool; state from the cache or None (no cache).

        `has_padding=False` (static) promises an all-true mask and skips the conv's compaction.
        """
        b, t, _ = x.shape
        hk, hv, dk, dv = self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim
        x = jnp.where(token_mask[..., None], x, 0).astype(x.dtype)
        mixed = self.in_proj_qkv(x)
        z = self.in_proj_z(x).reshape(b, t, hv, dv)
        beta = jax.nn.sigmoid(self.in_proj_b(x).astype(jnp.float32))
        a = self.in_proj_a(x).astype(jnp.float32)
        g = -jnp.exp(self.A_log[...].astype(jnp.float32)) * jax.nn.softplus(
            a + self.dt_bias[...].astype(jnp.float32)
        )
        beta = jnp.where(token_mask[..., None], beta, 0.0)
        g = jnp.where(token_mask[..., None], g, 0.0)

        conv_in = None if state is None else state.conv_state
        mixed, conv_state = gated_delta.causal_conv1d(
            mixed, self.conv1d.weight[...], conv_in, token_mask if has_padding else None
        )
        q = mixed[..., : hk * dk].reshape(b, t, hk, dk)
        k = mixed[..., hk * dk : 2 * hk * dk].reshape(b, t, hk, dk)
        v = mixed[..., 2 * hk * dk :].reshape(b, t, hv, dv)
        v = constrain(v, ("batch", "seq", "linear_heads", None))

        if state is not None and t == 1:
            core, rec_state = gated_delta.recurrent_gated_delta_rule(
                q, k, v, g, beta, state.recurrent_state
            )
        else:
            core, rec_state = gated_delta.chunk_gated_delta_rule(
                q,
                k,
                v,
                g,
                beta,
                None if state is None else state.recurrent_state,
                chunk_size=self.chunk_size,
            )
        out = self.norm(core, z).reshape(b, t, hv * dv)
        out = self.out_proj(out)
        new_state = (
            None
            if state is None
            else DeltaNetCache(conv_state=conv_state, recurrent_state=rec_state)
        )
        return out, new_state


ARCHITECTURE = Architecture(
    zero_centered_norm=True,
    attn_output_gate=True,
    linear_attention=GatedDeltaNet,
    full_attention_interval=4,
)


class Qwen3_5ForCausalLM(CausalLM):
    """Qwen3.5 text model with LM head (HF `Qwen3_5ForCausalLM`)."""

    family = NAME
    architecture = ARCHITECTURE


def fields_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    """`ModelConfig` fields of a `qwen3_5` (multimodal) or `qwen3_5_text` config.json."""
    top = hf
    if hf.get("model_type") == WRAPPER_MODEL_TYPE:
        if "text_config" not in hf:
            raise ValueError(
                "config.json has model_type 'qwen3_5' but no text_config; "
                "pass the Qwen3_5ForConditionalGeneration config unmodified."
            )
        if hf.get("vision_config"):
            logger.info("Ignoring vision_config: only the Qwen3.5 text model is built.")
        hf = hf["text_config"]
    model_type = hf.get("model_type", TEXT_MODEL_TYPE)
    if model_type != TEXT_MODEL_TYPE:
        raise ValueError(
            f"Unsupported text_config model_type {model_type!r}; Qwen3.5 text models are "
            f"{TEXT_MODEL_TYPE!r}. MoE variants (qwen3_5_moe, qwen3_next) are not built."
        )
    fields = hf_text_fields(hf, top, model_type=model_type, partial_rotary_factor=0.25)
    interval = hf.get("full_attention_interval", ARCHITECTURE.full_attention_interval)
    layer_types = hf.get("layer_types") or layer_pattern(fields["num_hidden_layers"], interval)
    fields["layer_types"] = tuple(layer_types)
    fields.update({name: hf_field(hf, name, model_type) for name in LINEAR_ATTENTION_FIELDS})
    return fields


def to_hf(config: ModelConfig) -> dict[str, Any]:
    """The `qwen3_5_text` config.json of `config` (what `Qwen3_5ForCausalLM` saves)."""
    out = hf_text_dict(config)
    # Text-only positions make the three M-RoPE rows equal; the section only has to sum to
    # rotary_dim / 2 for HF to accept it.
    half = config.rotary_dim // 2
    out["rope_parameters"].update(
        partial_rotary_factor=config.partial_rotary_factor,
        mrope_section=[half - 2 * (half // 3), half // 3, half // 3],
        mrope_interleaved=True,
    )
    out.update({name: getattr(config, name) for name in LINEAR_ATTENTION_FIELDS})
    return out
