"""Log-probabilities of given tokens without materialising [B, T, V] logits.

A 248K vocabulary makes full logits 1 MB per token in float32, so the projection to the
vocabulary runs over sequence chunks under `lax.map`, each chunk rematerialised in the backward
pass: peak memory holds one [B, chunk, V] block instead of [B, T, V]. When all of a batch's logits
are small (a tiny vocabulary: at most `SAVE_LOGITS_BYTES`), they are kept for the backward pass
instead, which saves recomputing the projection (a quarter of the head's matmuls).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from intraskill_jax.models.decoder import CausalLM

SAVE_LOGITS_BYTES = 256 << 20


def logprobs_from_hidden(
    hidden: jax.Array,
    output_embedding: jax.Array,
    targets: jax.Array,
    *,
    chunk_size: int = 512,
    temperature: float = 1.0,
    compute_dtype: jnp.dtype = jnp.float32,
    return_entropy: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """log softmax(h_t Wᵀ / temperature)[targets_t] for every position.

    Args:
      hidden: [B, T, h] final-normed hidden states.
      output_embedding: [V, h] (lm_head weight, or the embedding when tied).
      targets: [B, T] int token ids scored at each position.
      chunk_size: positions per vocabulary projection.
      temperature: divides the logits (use the sampler's temperature for its log-probs).
      compute_dtype: matmul input dtype; logits and log-softmax are float32.
      return_entropy: also return the entropy of each position's distribution.
    Returns:
      log-probs [B, T] float32 (and entropy [B, T] float32).
    """
    b, t, d = hidden.shape
    chunk = min(chunk_size, t)
    pad = (-t) % chunk
    if pad:
        hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, pad)))
    n = (t + pad) // chunk
    hs = hidden.reshape(b, n, chunk, d).swapaxes(0, 1)  # [N, B, c, h]
    ts = targets.reshape(b, n, chunk).swapaxes(0, 1)  # [N, B, c]
    w = output_embedding.astype(compute_dtype)

    def one(xs):
        h_c, t_c = xs
        logits = (
            jnp.einsum(
                "bcd,vd->bcv", h_c.astype(compute_dtype), w, preferred_element_type=jnp.float32
            )
            / temperature
        )
        lse = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, t_c[..., None].astype(jnp.int32), axis=-1)[..., 0]
        if not return_entropy:
            return picked - lse, jnp.zeros_like(lse)
        probs = jnp.exp(logits - lse[..., None])
        return picked - lse, lse - jnp.sum(probs * logits, axis=-1)

    if b * (t + pad) * w.shape[0] * 4 > SAVE_LOGITS_BYTES:
        one = jax.checkpoint(one)  # keep only the chunk inputs for the backward pass, not [B, c, V] logits
    lp, ent = jax.lax.map(one, (hs, ts))
    lp = lp.swapaxes(0, 1).reshape(b, n * chunk)[:, :t]
    if not return_entropy:
        return lp
    return lp, ent.swapaxes(0, 1).reshape(b, n * chunk)[:, :t]


def token_logprobs(
    model: CausalLM,
    input_ids: jax.Array,
    targets: jax.Array,
    attention_mask: jax.Array | None = None,
    *,
    chunk_size: int | None = None,
    temperature: float = 1.0,
    positions: jax.Array | None = None,
    return_entropy: bool = False,
    target_positions: jax.Array | None = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Log-prob of `targets[b, t]` under the model's next-token distribution after input_ids[b, :t+1].

    For teacher forcing pass `targets = input_ids` shifted left by one (the last column is then
    arbitrary). Positions where `attention_mask` is 0 get log-prob (and entropy) 0.

    Args:
      model: a `CausalLM` (Qwen3.5 or Qwen3).
      input_ids, targets: [B, T] int.
      attention_mask: [B, T] or None (all real tokens).
      chunk_size: sequence chunk for the vocabulary projection (default config.logits_chunk_size).
      temperature: sampling temperature whose distribution is scored.
      target_positions: [B, K] int: score only these positions, `targets` then being [B, K] (the
        target of each); the vocabulary projection runs on K positions instead of T.
    Returns:
      [B, T] (or [B, K]) float32 log-probs (and entropies when `return_entropy`).
    """
    hidden, _ = model.hidden_states(input_ids, attention_mask, positions=positions)
    if target_positions is not None:
        hidden = jnp.take_along_axis(hidden, target_positions[..., None], axis=1)
        if attention_mask is not None:
            attention_mask = jnp.take_along_axis(attention_mask, target_positions, axis=1)
    out = logprobs_from_hidden(
        hidden,
        model.output_embedding(),
        targets,
        chunk_size=chunk_size or model.config.logits_chunk_size,
        temperature=temperature,
        compute_dtype=model.config.compute_dtype,
        return_entropy=return_entropy,
    )
    if attention_mask is None:
        return out
    keep = attention_mask.astype(bool)
    if return_entropy:
        return tuple(jnp.where(keep, o, 0.0) for o in out)
    return jnp.where(keep, out, 0.0)
