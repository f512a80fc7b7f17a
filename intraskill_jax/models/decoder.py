"""The decoder stack shared by the Qwen families, in Flax NNX.

embed_tokens -> layers (each: norm -> mixer -> residual -> norm -> SwiGLU MLP -> residual) -> norm
-> LM head. A family configures the stack with an `Architecture` on its model class (norm style,
attention output gate, the mixer of 'linear_attention' layers); sizes and the layer pattern come
from `ModelConfig`. Qwen3.5 is Gated DeltaNet + gated attention (`models/qwen3_5/`), Qwen3 dense
is full attention only with plain norms (`models/qwen3/`), Llama is Qwen3 without q/k norms
(`models/llama/`).

Attribute names and parameter shapes follow HF (`Qwen3_5ForCausalLM`, `Qwen3ForCausalLM`), so the
NNX state path of every parameter joined with '.' is its HF key (`model.layers.0.mlp.up_proj.weight`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from intraskill_jax.models.cache import AttentionCache, DecodeCache, LayerCache
from intraskill_jax.models.config import ModelConfig
from intraskill_jax.models.layers import (
    MLP,
    Attention,
    Embedding,
    Linear,
    RMSNorm,
    SharedKV,
    constrain,
    matmul_dtype,
    rope_cos_sin,
)
from intraskill_jax.models.sharding import logical_axes


@dataclasses.dataclass(frozen=True, kw_only=True)
class Architecture:
    """What a family fixes in the decoder stack; `ModelConfig` holds the sizes.

    Attributes:
      zero_centered_norm: RMSNorms compute x̂·(1 + w), w initialised to 0 (Gemma-style); otherwise
        x̂·w, w initialised to 1. Applies to the layer, final and q/k norms.
      attn_output_gate: q_proj also emits a per-head gate and attention's output is multiplied by
        sigmoid(gate) before o_proj.
      qk_norm: RMSNorm over each head of the queries and keys before RoPE (Qwen; Llama has none).
      linear_attention: the mixer of 'linear_attention' layers (HF attribute `linear_attn`), built
        as `linear_attention(config, rngs=rngs)` and called as
        `(x, token_mask, state, has_padding=...) -> (y, state)`; None: the family has only
        'full_attention' layers.
      full_attention_interval: the layer pattern when a config names none: every k-th layer is
        full attention, the others linear attention (1: all full attention).
    """

    zero_centered_norm: bool
    attn_output_gate: bool
    qk_norm: bool = True
    linear_attention: Callable[..., nnx.Module] | None = None
    full_attention_interval: int = 1

    def __post_init__(self) -> None:
        if self.full_attention_interval < 1:
            raise ValueError(f"full_attention_interval must be >= 1; got {self.full_attention_interval}.")
        if self.linear_attention is None and self.full_attention_interval != 1:
            raise ValueError(
                "An architecture without a linear_attention mixer has only full-attention layers; "
                f"full_attention_interval must be 1, got {self.full_attention_interval}."
            )


_REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "minimal": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
}


class DecoderLayer(nnx.Module):
    """norm -> mixer (linear_attn | self_attn) -> residual -> norm -> SwiGLU mlp -> residual."""

    def __init__(
        self, config: ModelConfig, architecture: Architecture, layer_type: str, *, rngs: nnx.Rngs
    ):
        c, arch = config, architecture
        self.layer_type = layer_type
        norm_kw = {
            "eps": c.rms_norm_eps,
            "zero_centered": arch.zero_centered_norm,
            "param_dtype": c.params_dtype,
        }
        self.input_layernorm = RMSNorm(c.hidden_size, **norm_kw)
        if layer_type == "linear_attention":  # ModelConfig allows it only with a mixer
            self.linear_attn = arch.linear_attention(c, rngs=rngs)
        else:
            self.self_attn = Attention(
                hidden=c.hidden_size,
                num_heads=c.num_attention_heads,
                num_kv_heads=c.num_key_value_heads,
                head_dim=c.head_dim,
                output_gate=arch.attn_output_gate,
                qk_norm=arch.qk_norm,
                zero_centered_norm=arch.zero_centered_norm,
                eps=c.rms_norm_eps,
                use_bias=c.attention_bias,
                dtype=c.compute_dtype,
                param_dtype=c.params_dtype,
                init_std=c.initializer_range,
                rngs=rngs,
                block_size=c.attention_block_size,
                cache_block_size=c.cache_block_size,
                cache_product_dtype=c.cache_product_dtype,
            )
        self.post_attention_layernorm = RMSNorm(c.hidden_size, **norm_kw)
        self.mlp = MLP(
            c.hidden_size,
            c.intermediate_size,
            use_bias=c.mlp_bias,
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
        shared: SharedKV | None = None,
        *,
        has_padding: bool = True,
    ) -> tuple[jax.Array, LayerCache | None]:
        h = self.input_layernorm(x)
        if self.layer_type == "linear_attention":
            h, new_cache = self.linear_attn(h, token_mask, layer_cache, has_padding=has_padding)
        else:
            kv = None if layer_cache is None else (layer_cache.key, layer_cache.value)
            h, kv = self.self_attn(
                h, cos, sin, key_valid=key_valid, kv_cache=kv, query_slots=query_slots, shared=shared
            )
            new_cache = None if kv is None else AttentionCache(key=kv[0], value=kv[1])
        x = x + h
        x = x + self.mlp(self.post_attention_layernorm(x))
        return constrain(x, ("batch", "seq", "embed")), new_cache


def _stack(layers: list[DecoderLayer]) -> tuple[nnx.GraphDef, Any, list[jax.Array]]:
    """The graphdef and State treedef the layers share, and each parameter stacked over them to
    [len(layers), ...], sharded like one layer's with the new axis unsharded."""
    splits = [nnx.split(layer) for layer in layers]
    per_layer = [
        jax.tree.leaves(state, is_leaf=lambda v: isinstance(v, nnx.Variable)) for _, state in splits
    ]
    stacked = []
    for variables in zip(*per_layer):
        stack = jnp.stack([v.get_value() for v in variables])
        axes = logical_axes(variables[0])
        stacked.append(stack if axes is None else constrain(stack, (None, *axes)))
    graphdef, state = splits[0]
    return graphdef, jax.tree.structure(state), stacked


class TextModel(nnx.Module):
    """embed_tokens -> layers -> norm (HF `Qwen3_5TextModel` / `Qwen3Model`)."""

    def __init__(self, config: ModelConfig, architecture: Architecture, *, rngs: nnx.Rngs):
        self.config = config
        self.embed_tokens = Embedding(
            config.vocab_size,
            config.hidden_size,
            dtype=config.compute_dtype,
            param_dtype=config.params_dtype,
            init_std=config.initializer_range,
            rngs=rngs,
        )
        self.layers = nnx.List(
            [DecoderLayer(config, architecture, t, rngs=rngs) for t in config.layer_types]
        )
        self.norm = RMSNorm(
            config.hidden_size,
            eps=config.rms_norm_eps,
            zero_centered=architecture.zero_centered_norm,
            param_dtype=config.params_dtype,
        )

    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        *,
        cache: DecodeCache | None = None,
        positions: jax.Array | None = None,
        shared: DecodeCache | None = None,
    ) -> tuple[jax.Array, DecodeCache | None]:
        """Final-normed hidden states [B, T, h] and the updated cache (None without one).

        `shared` (with a cache): a one-row cache holding a prefix's keys and values, which each row
        attends before its own slots, up to its `cache.shared_length` (`layers.SharedKV`)."""
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
        cos, sin = rope_cos_sin(positions, self.config.rotary_dim, self.config.rope_theta,
                                self.config.rope_scaling)

        x = constrain(self.embed_tokens(input_ids), ("batch", "seq", "embed"))
        has_padding = attention_mask is not None

        if self.config.scan_layers and cache is None:
            x = self._scanned_layers(x, cos, sin, token_mask, key_valid, has_padding=has_padding)
            return self.norm(x), None

        def run(layer: DecoderLayer, *args):
            return layer(*args, has_padding=has_padding)

        # Remat only pays off under a backward pass, which the cached (sampling) path never has; and
        # inside the sampler's decode loop nnx.remat cannot merge the parameters (TraceContextError).
        if self.config.remat != "none" and cache is None:
            run = nnx.remat(run, policy=_REMAT_POLICIES[self.config.remat])
        new_layers = []
        for i, layer in enumerate(self.layers):
            layer_cache = None if cache is None else cache.layers[i]
            segment = None if shared is None else shared.layers[i]
            if isinstance(segment, AttentionCache):
                segment = SharedKV(key=segment.key[0], value=segment.value[0], length=cache.shared_length)
            else:  # a recurrent layer's prefix state is copied into each row instead
                segment = None
            x, layer_cache = run(
                layer, x, cos, sin, token_mask, key_valid, query_slots, layer_cache, segment
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
            shared_length=cache.shared_length,
        )

    def _scanned_layers(
        self,
        x: jax.Array,
        cos: jax.Array,
        sin: jax.Array,
        token_mask: jax.Array,
        key_valid: jax.Array,
        *,
        has_padding: bool,
    ) -> jax.Array:
        """The layers without a cache as one `lax.scan` over the repeats of the layer period.

        The parameters stay one module per layer (NNX paths are HF keys, which checkpoints,
        export and sharding rules rely on); the same-position layers' leaves are stacked here, in
        the traced program, to [repeats, ...] and keep their own sharding with the new axis
        unsharded. The scan body merges each slice back into a layer per position, so a
        program traces and compiles `layer_period` layers rather than all of them.
        """
        period = self.config.layer_period
        graphdefs, treedefs, stacked = zip(
            *(_stack(list(self.layers)[position::period]) for position in range(period))
        )

        def layer_step(graphdef: nnx.GraphDef, treedef: Any) -> Callable[..., jax.Array]:
            def step(x: jax.Array, leaves: list[jax.Array]) -> jax.Array:
                layer = nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))
                return layer(x, cos, sin, token_mask, key_valid, None, None, has_padding=has_padding)[0]

            if self.config.remat == "none":
                return step
            # Remat per layer, as unrolled, not per scan step: checkpointing the whole period made
            # Qwen3.5-4B's GRPO update need 64.3 GiB per v5p chip and 3% more FLOPs, per layer 42.9
            # GiB. The parameters are operands here, so plain jax.checkpoint suffices (no
            # nnx.remat); scan keeps iterations apart, hence prevent_cse=False.
            return jax.checkpoint(step, policy=_REMAT_POLICIES[self.config.remat], prevent_cse=False)

        steps = [layer_step(g, t) for g, t in zip(graphdefs, treedefs)]

        def body(x: jax.Array, params: list[list[jax.Array]]) -> tuple[jax.Array, None]:
            for step, leaves in zip(steps, params):
                x = step(x, leaves)
            return x, None

        x, _ = jax.lax.scan(body, x, stacked)
        return x


class CausalLM(nnx.Module):
    """`model` (TextModel) plus `lm_head` (absent when embeddings are tied).

    A family subclasses it, naming its `family` (`ModelConfig.family`) and its `architecture`.
    """

    family: ClassVar[str]
    architecture: ClassVar[Architecture]

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        if config.family != self.family:
            raise ValueError(
                f"{type(self).__name__} needs family={self.family!r}; got {config.family!r}."
            )
        if self.architecture.linear_attention is None and config.has_linear_attention:
            raise ValueError(
                f"family {self.family!r} has only 'full_attention' layers, but layer_types has "
                "'linear_attention'; drop them or pick a family with linear attention."
            )
        self.config = config
        self.model = TextModel(config, self.architecture, rngs=rngs)
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
        # output_embedding() as [h, V]: only on the sampler's model (`transpose_for_decode`).
        self.output_embedding_t: nnx.Variable | None = None

    def output_embedding(self) -> jax.Array:
        """The [V, h] matrix that maps hidden states to logits."""
        if self.config.tie_word_embeddings:
            return self.model.embed_tokens.weight[...]
        return self.lm_head.weight[...]

    def transpose_for_decode(self) -> None:
        """Gives every linear layer and the logits an [in, out] copy of their weight, in place.

        For the sampler on CPU (`ModelConfig.transpose_decode_weights`): a decode step multiplies
        a few rows by each weight, which XLA:CPU's dots (YNNPACK) do ~1.5x faster from an [in, out]
        weight than from HF's [out, in]; writing the product the other way round does not help, XLA
        folds it back into the same dot. The sampler calls it once per weight version on a model of
        its own (`rollout.jax_sampler.for_sampling`).
        """
        for _, module in nnx.iter_modules(self):
            if isinstance(module, Linear):
                module.weight_t = nnx.data(nnx.Variable(module.weight[...].T))
        self.output_embedding_t = nnx.data(nnx.Variable(self.output_embedding().T))

    def hidden_states(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        *,
        cache: DecodeCache | None = None,
        positions: jax.Array | None = None,
        shared: DecodeCache | None = None,
    ) -> tuple[jax.Array, DecodeCache | None]:
        return self.model(input_ids, attention_mask, cache=cache, positions=positions, shared=shared)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """[..., h] -> float32 logits [..., V]."""
        if self.output_embedding_t is not None:
            w, spec = self.output_embedding_t[...], "...d,dv->...v"
        else:
            w, spec = self.output_embedding(), "...d,vd->...v"
        dt = matmul_dtype(self.config.compute_dtype, w.dtype)
        return jnp.einsum(spec, hidden.astype(dt), w.astype(dt), preferred_element_type=jnp.float32)

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
