"""Pure token sampling: temperature, top-k, top-p, and the log-probs the trainer recomputes.

The returned log-prob is log softmax(logits / T) of the sampled token, taken *before* top-k/top-p
filtering (SGLang's default), which is exactly what `models.token_logprobs(..., temperature=T)`
recomputes in the trainer. With T = 0 sampling is greedy and the log-prob is at T = 1.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def filter_logits(logits: jax.Array, top_k: int, top_p: jax.Array | float) -> jax.Array:
    """Masks (to -inf) tokens outside the top-k and outside the smallest top-p nucleus.

    logits: [B, V] (already temperature-scaled). `top_k` is static (0: off); top_p in (0, 1]. The
    nucleus needs a sort of the vocabulary, which XLA:CPU does slowly (~9 ms at [32, 900], most of
    a decode step), so it runs only when top_p < 1.
    """
    neg = jnp.finfo(logits.dtype).min
    if top_k > 0:
        kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
        logits = jnp.where(logits < kth, neg, logits)

    def nucleus(logits: jax.Array) -> jax.Array:
        order = jnp.argsort(-logits, axis=-1)
        sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
        probs = jax.nn.softmax(sorted_logits, axis=-1)
        # Keep a token while the mass strictly before it is < top_p (so the top token always stays).
        keep_sorted = (jnp.cumsum(probs, axis=-1) - probs) < top_p
        keep = jnp.zeros_like(keep_sorted).at[jnp.arange(logits.shape[0])[:, None], order].set(keep_sorted)
        return jnp.where(keep, logits, neg)

    return jax.lax.cond(jnp.asarray(top_p) < 1.0, nucleus, lambda x: x, logits)


def categorical(key: jax.Array, logits: jax.Array) -> jax.Array:
    """One draw per row from softmax(logits) [B, V] by inverting its CDF at a uniform point.

    The same distribution as `jax.random.categorical`, from B uniforms instead of B x V Gumbel
    draws (generating those was ~1 ms of every CPU decode step). A token of probability 0 (masked
    to the dtype's minimum) never comes out: the first cumulative sum above u has positive mass.
    """
    cdf = jnp.cumsum(jax.nn.softmax(logits, axis=-1), axis=-1)
    u = jax.random.uniform(key, (logits.shape[0], 1), cdf.dtype) * cdf[:, -1:]
    return jnp.minimum(jnp.sum(cdf <= u, axis=-1), logits.shape[-1] - 1)


def sample_tokens(logits: jax.Array, key: jax.Array, temperature: jax.Array | float, top_p: jax.Array | float,
                  top_k: int) -> tuple[jax.Array, jax.Array]:
    """Samples one token per row. logits [B, V] float32 -> (tokens [B] int32, logprobs [B] float32)."""
    greedy = temperature <= 0
    t = jnp.where(greedy, 1.0, temperature)
    scaled = logits.astype(jnp.float32) / t
    logp = jax.nn.log_softmax(scaled, axis=-1)
    sampled = categorical(key, filter_logits(scaled, top_k, top_p))
    tokens = jnp.where(greedy, jnp.argmax(scaled, axis=-1), sampled).astype(jnp.int32)
    return tokens, jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
