"""Qwen3.5 text model in Flax NNX: Gated DeltaNet + gated attention hybrid (reference §3-§6).

The same decoder stack, built from a `family='qwen3'` config (all layers full attention, plain
norms, no output gate, full RoPE), is Qwen3 dense; `models/qwen3.py` names it.

Attribute names and parameter shapes follow HF `Qwen3_5ForCausalLM`, so the NNX state path of
every parameter joined with '.' is its HF key (`model.layers.0.linear_attn.A_log`, ...).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from intraskill_jax.models import gated_delta
from intraskill_jax.models.cache import (
    AttentionCache,
    DecodeCache,
    DeltaNetCache,
    LayerCache,
)
from intraskill_jax.models.config import ModelConfig
from intraskill_jax.models.layers import (
    MLP,
    Attention,
    Embedding,
    GatedRMSNorm,
    Linear,
    RMSNorm,
    constrain,
    param,
    rope_cos_sin,
)

_REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
}


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


class DecoderLayer(nnx.Module):
    """norm -> mixer (linear_attn | self_attn) -> residual -> norm -> SwiGLU mlp -> residual."""

    def __init__(self, config: ModelConfig, layer_type: str, *, rngs: nnx.Rngs):
        c = config
        self.layer_type = layer_type
        norm_kw = {
            "eps": c.rms_norm_eps,
            "zero_centered": c.zero_centered_norm,
            "param_dtype": c.params_dtype,
        }
        self.input_layernorm = RMSNorm(c.hidden_size, **norm_kw)
        if layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(c, rngs=rngs)
        else:
            self.self_attn = Attention(
                hidden=c.hidden_size,
                num_heads=c.num_attention_heads,
                num_kv_heads=c.num_key_value_heads,
                head_dim=c.head_dim,
                output_gate=c.attn_output_gate,
                zero_centered_norm=c.zero_centered_norm,
                eps=c.rms_norm_eps,
                use_bias=c.attention_bias,
                dtype=c.compute_dtype,
                param_dtype=c.params_dtype,
                init_std=c.initializer_range,
                rngs=rngs,
                block_size=c.attention_block_size,
            )
        self.post_attention_layernorm = RMSNorm(c.hidden_size, **norm_kw)
        self.mlp = MLP(
            c.hidden_size,
            c.intermediate_size,
            dtype=c.compute_dtype,
            param_dtype=c.params_dtype,
            init_std=c.initializer_range,
            rngs=rngs,
        )

    def __call__(
        self,
        x: jax.Array,
        cos: jax.Array,
        sin: jax.Array,
        token_mask: jax.Array,
        key_valid: jax.Array,
        query_slots: jax.Array | None,
        layer_cache: LayerCache | None,
        *,
        has_padding: bool = True,
    ) -> tuple[jax.Array, LayerCache | None]:
        h = self.input_layernorm(x)
        if self.layer_type == "linear_attention":
            h, new_cache = self.linear_attn(h, token_mask, layer_cache, has_padding=has_padding)
        else:
            kv = None if layer_cache is None else (layer_cache.key, layer_cache.value)
            h, kv = self.self_attn(
                h, cos, sin, key_valid=key_valid, kv_cache=kv, query_slots=query_slots
            )
            new_cache = None if kv is None else AttentionCache(key=kv[0], value=kv[1])
        x = x + h
        x = x + self.mlp(self.post_attention_layernorm(x))
        return constrain(x, ("batch", "seq", "embed")), new_cache


class TextModel(nnx.Module):
    """embed_tokens -> layers -> norm (HF `Qwen3_5TextModel` / `Qwen3Model`)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.embed_tokens = Embedding(
            config.vocab_size,
            config.hidden_size,
            dtype=config.compute_dtype,
            param_dtype=config.params_dtype,
            init_std=config.initializer_range,
            rngs=rngs,
        )
        self.layers = nnx.List([DecoderLayer(config, t, rngs=rngs) for t in config.layer_types])
        self.norm = RMSNorm(
            config.hidden_size,
            eps=config.rms_norm_eps,
            zero_centered=config.zero_centered_norm,
            param_dtype=config.params_dtype,
        )

    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        *,
        cache: DecodeCache | None = None,
        positions: jax.Array | None = None,
    ) -> tuple[jax.Array, DecodeCache | None]:
        """Final-normed hidden states [B, T, h] and the updated cache (None without one)."""
        b, t = input_ids.shape
        token_mask = (
            jnp.ones((b, t), bool) if attention_mask is None else attention_mask.astype(bool)
        )
        # Real tokens count from 0 in each row; left padding gets position 0 (it is masked anyway).
        offsets = jnp.maximum(jnp.cumsum(token_mask, axis=1, dtype=jnp.int32) - 1, 0)
        if cache is None:
            key_valid, query_slots = token_mask, None  # attention without a cache writes no slots
            default_positions = offsets
        else:
            # Each row writes only its real tokens, at its own next slots; padding goes to an
            # out-of-range slot that the scatter drops.
            query_slots = jnp.where(token_mask, cache.length[:, None] + offsets, cache.max_length)
            key_valid = cache.key_valid.at[jnp.arange(b)[:, None], query_slots].set(True, mode="drop")
            default_positions = cache.next_position[:, None] + offsets
        positions = default_positions if positions is None else positions
        cos, sin = rope_cos_sin(positions, self.config.rotary_dim, self.config.rope_theta)

        x = constrain(self.embed_tokens(input_ids), ("batch", "seq", "embed"))
        has_padding = attention_mask is not None

        def run(layer: DecoderLayer, *args):
            return layer(*args, has_padding=has_padding)

        # Remat only pays off under a backward pass, which the cached (sampling) path never has; and
        # inside the sampler's decode loop nnx.remat cannot merge the parameters (TraceContextError).
        if self.config.remat != "none" and cache is None:
            run = nnx.remat(run, policy=_REMAT_POLICIES[self.config.remat])
        new_layers = []
        for i, layer in enumerate(self.layers):
            layer_cache = None if cache is None else cache.layers[i]
            x, layer_cache = run(
                layer, x, cos, sin, token_mask, key_valid, query_slots, layer_cache
            )
            new_layers.append(layer_cache)
        x = self.norm(x)
        if cache is None:
            return x, None
        return x, DecodeCache(
            layers=tuple(new_layers),
            key_valid=key_valid,
            length=cache.length + jnp.sum(token_mask, axis=1, dtype=jnp.int32),
            next_position=cache.next_position + jnp.sum(token_mask, axis=1, dtype=jnp.int32),
        )


class CausalLM(nnx.Module):
    """`model` (TextModel) plus `lm_head` (absent when embeddings are tied)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.model = TextModel(config, rngs=rngs)
        if not config.tie_word_embeddings:
            self.lm_head = Linear(
                config.hidden_size,
                config.vocab_size,
                axes=("vocab", "embed"),
                dtype=config.compute_dtype,
                param_dtype=config.params_dtype,
                init_std=config.initializer_range,
                rngs=rngs,
            )

    def output_embedding(self) -> jax.Array:
        """The [V, h] matrix that maps hidden states to logits."""
        if self.config.tie_word_embeddings:
            return self.model.embed_tokens.weight[...]
        return self.lm_head.weight[...]

    def hidden_states(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        *,
        cache: DecodeCache | None = None,
        positions: jax.Array | None = None,
    ) -> tuple[jax.Array, DecodeCache | None]:
        return self.model(input_ids, attention_mask, cache=cache, positions=positions)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """[..., h] -> float32 logits [..., V]."""
        w = self.output_embedding().astype(self.config.compute_dtype)
        return jnp.einsum(
            "...d,vd->...v",
            hidden.astype(self.config.compute_dtype),
            w,
            preferred_element_type=jnp.float32,
        )

    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        *,
        cache: DecodeCache | None = None,
        positions: jax.Array | None = None,
    ) -> jax.Array | tuple[jax.Array, DecodeCache]:
        """Logits [B, T, V] (float32); with a cache, (logits, updated cache).

        Args:
          input_ids: [B, T] int.
          attention_mask: [B, T], 1 for real tokens, 0 for padding (left padding for batched
            prompts; trailing padding is harmless without a cache). Defaults to all ones.
          cache: from `init_cache`, continued across calls (prefill, then decode steps).
          positions: [B, T] RoPE positions; default counts real tokens from 0 per row.
        """
        hidden, new_cache = self.hidden_states(
            input_ids, attention_mask, cache=cache, positions=positions
        )
        logits = self.logits(hidden)
        return logits if cache is None else (logits, new_cache)


class Qwen3_5ForCausalLM(CausalLM):
    """Qwen3.5 text model with LM head (HF `Qwen3_5ForCausalLM`)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        if config.family != "qwen3_5":
            raise ValueError(f"Qwen3_5ForCausalLM needs family='qwen3_5'; got {config.family!r}.")
        super().__init__(config, rngs=rngs)
