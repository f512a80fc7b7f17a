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


def argmax(logits: jax.Array) -> jax.Array:
    """The first index of each row's maximum, [B, V] -> [B] int32, as `jnp.argmax`.

    Two plain reductions (the maximum, then the lowest index holding it): XLA:CPU runs
    `jnp.argmax`'s paired value-index reduction element by element, ~3x slower at [32, 1024] and
    [8, 8192]. A row without a maximum (NaN) gives the last index.
    """
    v = logits.shape[-1]
    top = jnp.max(logits, axis=-1, keepdims=True)
    first = jnp.min(jnp.where(logits == top, jnp.arange(v, dtype=jnp.int32), v), axis=-1)
    return jnp.minimum(first, v - 1)


def categorical(key: jax.Array, logits: jax.Array, block: int = 128) -> jax.Array:
    """One draw per row from softmax(logits) [B, V] by inverting its CDF at a uniform point.

    The same distribution as `jax.random.categorical`, from B uniforms instead of B x V Gumbel
    draws (generating those was ~1 ms of every CPU decode step). The CDF is inverted in two levels,
    never built whole: the uniform point picks a block of `block` tokens from the blocks' running
    mass, then a token within that block. A full-vocabulary cumulative sum is a slow window
    reduction on XLA:CPU (2.5x this at [32, 1024], 8x at [8, 8192]). A token of probability 0
    (masked to the dtype's minimum) never comes out: each level picks the first entry whose running
    mass exceeds the point, which has mass of its own.
    """
    b, v = logits.shape
    blocks = -(-v // block)
    mass = jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))
    mass = jnp.pad(mass, ((0, 0), (0, blocks * block - v))).reshape(b, blocks, block)
    running = jnp.cumsum(jnp.sum(mass, axis=-1), axis=-1)  # [B, blocks]
    total = running[:, -1]
    # u in [0, total): a uniform at 1 - 2^-24 times the total could round up to the total itself.
    u = jnp.minimum(jax.random.uniform(key, (b,), mass.dtype) * total, jnp.nextafter(total, 0))
    chosen = jnp.sum(running <= u[:, None], axis=-1)
    before = jnp.take_along_axis(jnp.pad(running, ((0, 0), (1, 0))), chosen[:, None], axis=1)[:, 0]  # mass ahead
    row = jnp.take_along_axis(mass, chosen[:, None, None], axis=1)[:, 0]  # [B, block]
    within = jnp.sum(jnp.cumsum(row, axis=-1) <= (u - before)[:, None], axis=-1)
    # The block's own running sum can round below what the first level counted: stay on its last
    # token with mass.
    last = jnp.max(jnp.where(row > 0, jnp.arange(block), 0), axis=-1)
    return (chosen * block + jnp.minimum(within, last)).astype(jnp.int32)


def sample_tokens(logits: jax.Array, key: jax.Array, temperature: jax.Array | float, top_p: jax.Array | float,
                  top_k: int, exclude: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Samples one token per row. logits [B, V] float32 -> (tokens [B] int32, logprobs [B] float32).

    Greedy (temperature <= 0) and sampled draws are branches of a `lax.cond`: a step computes only
    the one it takes. `exclude` [B] (-1: none) is a token each sampled row draws without, from the
    filtered distribution renormalized: the residual of a drafted token just rejected
    (`accept_drafts`). A greedy row's maximum is never that token, so it ignores it.
    """
    greedy, scaled = _scaled(logits, temperature)

    def draw(scaled: jax.Array) -> jax.Array:
        kept = filter_logits(scaled, top_k, top_p)
        if exclude is not None:
            kept = jnp.where(jnp.arange(kept.shape[-1]) == exclude[:, None], jnp.finfo(kept.dtype).min, kept)
        return categorical(key, kept)

    tokens = jax.lax.cond(greedy, argmax, draw, scaled)
    return tokens, _logprob_of(scaled, tokens)


def _scaled(logits: jax.Array, temperature: jax.Array | float) -> tuple[jax.Array, jax.Array]:
    """(greedy, the float32 logits over the temperature): T <= 0 is greedy, its logits at T = 1."""
    greedy = jnp.asarray(temperature) <= 0
    return greedy, logits.astype(jnp.float32) / jnp.where(greedy, 1.0, temperature)


def _logprob_of(scaled: jax.Array, tokens: jax.Array) -> jax.Array:
    """log softmax(scaled) [B, V] at tokens [B], before any filtering."""
    top = jnp.max(scaled, axis=-1)
    log_total = jnp.log(jnp.sum(jnp.exp(scaled - top[:, None]), axis=-1)) + top
    return jnp.take_along_axis(scaled, tokens[:, None], axis=-1)[:, 0] - log_total


def accept_drafts(logits: jax.Array, drafts: jax.Array, key: jax.Array, temperature: jax.Array | float,
                  top_p: jax.Array | float, top_k: int) -> tuple[jax.Array, jax.Array]:
    """Whether each drafted token is kept, and its log-prob: logits [N, V] (the distribution at each
    drafted token's place), drafts [N] -> (kept [N] bool, logprobs [N] float32).

    Greedy: kept where the draft is the maximum, so the reply is token for token the one plain
    decoding gives. Sampled: kept with the draft's probability under the filtered distribution
    (speculative sampling with a draft that is a single token: q(d) = 1). A rejected draft's place
    is then drawn from the same distribution without it (`sample_tokens(exclude=...)`), so every
    token is distributed as in plain decoding. The log-prob is `sample_tokens`'s, before filtering.
    """
    greedy, scaled = _scaled(logits, temperature)

    def sampled(scaled: jax.Array) -> jax.Array:
        kept = filter_logits(scaled, top_k, top_p)
        prob = jnp.exp(_logprob_of(kept, drafts))
        return jax.random.uniform(key, drafts.shape) < prob

    kept = jax.lax.cond(greedy, lambda s: argmax(s) == drafts, sampled, scaled)
    return kept, _logprob_of(scaled, drafts)
