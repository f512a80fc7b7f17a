"""Decode cache: KV slots for attention layers, (conv, recurrent) state for DeltaNet layers.

Each row writes only its real tokens, at its own next slots (`length[b]`), so padding costs no
slots and a row's slots are exactly its history; `key_valid` marks the slots written. Positions
count real tokens only, so a row's first real token has position 0 however much padding preceded it.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from intraskill_jax.models.config import ModelConfig


@flax.struct.dataclass
class AttentionCache:
    # [B, KV, S, D]: a decode step reads each head's keys as one contiguous [S, D] matrix (~3x
    # faster on CPU than [B, S, KV, D]).
    key: jax.Array  # post-norm, post-RoPE keys
    value: jax.Array


@flax.struct.dataclass
class DeltaNetCache:
    conv_state: jax.Array  # [B, K-1, C] pre-conv inputs of the last K-1 tokens
    recurrent_state: jax.Array  # [B, Hv, Dk, Dv] float32


LayerCache = AttentionCache | DeltaNetCache


@flax.struct.dataclass
class DecodeCache:
    layers: tuple[LayerCache, ...]  # one per decoder layer
    key_valid: jax.Array  # [B, S] bool, slot holds a real (unmasked) token
    length: jax.Array  # [B] int32, slots each row has written (its real tokens)
    next_position: jax.Array  # [B] int32, RoPE position of each row's next real token
    # [B] int32, the slots of a shared prefix segment each row attends before its own (0: none; the
    # segment is held apart, once for all rows: `layers.SharedKV`, `rollout.jax_sampler`)
    shared_length: jax.Array

    @property
    def max_length(self) -> int:
        return self.key_valid.shape[1]


def init_cache(
    config: ModelConfig, batch_size: int, max_length: int, dtype: jnp.dtype | None = None
) -> DecodeCache:
    """An empty cache for `batch_size` rows and up to `max_length` tokens (prompt + generated).

    Writing past `max_length` is not checked inside jit (those tokens would be dropped); size it for the
    longest prompt plus the number of new tokens.
    """
    dtype = config.compute_dtype if dtype is None else dtype
    layers: list[LayerCache] = []
    for layer_type in config.layer_types:
        if layer_type == "full_attention":
            shape = (batch_size, config.num_key_value_heads, max_length, config.head_dim)
            layers.append(
                AttentionCache(key=jnp.zeros(shape, dtype), value=jnp.zeros(shape, dtype))
            )
        else:
            layers.append(
                DeltaNetCache(
                    conv_state=jnp.zeros(
                        (batch_size, config.linear_conv_kernel_dim - 1, config.linear_conv_dim),
                        dtype,
                    ),
                    recurrent_state=jnp.zeros(
                        (
                            batch_size,
                            config.linear_num_value_heads,
                            config.linear_key_head_dim,
                            config.linear_value_head_dim,
                        ),
                        jnp.float32,
                    ),
                )
            )
    return DecodeCache(
        layers=tuple(layers),
        key_valid=jnp.zeros((batch_size, max_length), bool),
        length=jnp.zeros((batch_size,), jnp.int32),
        next_position=jnp.zeros((batch_size,), jnp.int32),
        shared_length=jnp.zeros((batch_size,), jnp.int32),
    )
