"""Gated delta rule (Gated DeltaNet, Yang et al. 2024) as pure JAX functions.

Notation: B batch, T time, Hk / Hv key / value heads (Hv a multiple of Hk), Dk / Dv head dims,
C conv channels, K conv kernel. Per value head the state is S ∈ R^{Dk×Dv} (float32) and each
token t brings q_t, k_t ∈ R^{Dk}, v_t ∈ R^{Dv}, a decay g_t ≤ 0 (log space) and a write
strength β_t ∈ (0, 1):

    S_t = exp(g_t) (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,      o_t = S_tᵀ q_t.

`recurrent_gated_delta_rule` is the token-by-token reference (also the one-token decode step);
`chunk_gated_delta_rule` is the same map computed 64 tokens at a time with a unit-lower-triangular
inverse per chunk (the WY/UT form) and a scan only across chunks; it is what prefill and training
use. Both take HF's arguments, L2-normalise q and k in float32 (`use_qk_l2norm_in_kernel`),
scale q by Dk^-½, repeat q/k heads Hk → Hv (`repeat_interleave`: value head j reads key head
j // (Hv/Hk)) and return (output [B, T, Hv, Dv] in v's dtype, final state [B, Hv, Dk, Dv] f32).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# The recurrences accumulate over thousands of steps; keep full float32 matmuls on accelerators.
_HIGHEST = jax.lax.Precision.HIGHEST


def l2norm(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """x · rsqrt(Σ x² + eps) over the last axis (the FLA / HF convention)."""
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def _prepare(q, k, v, g, beta, use_qk_l2norm):
    """Head repeat, float32, optional L2 norm and the Dk^-½ query scale."""
    hk, hv = k.shape[2], v.shape[2]
    if hv != hk:
        q = jnp.repeat(q, hv // hk, axis=2)
        k = jnp.repeat(k, hv // hk, axis=2)
    q, k, v, g, beta = (a.astype(jnp.float32) for a in (q, k, v, g, beta))
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    q = q * (q.shape[-1] ** -0.5)
    return q, k, v, g, beta


def _zero_state(v: jax.Array, dk: int) -> jax.Array:
    b, _, h, dv = v.shape
    return jnp.zeros((b, h, dk, dv), jnp.float32)


def recurrent_gated_delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    initial_state: jax.Array | None = None,
    *,
    use_qk_l2norm: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """Token-by-token gated delta rule (`lax.scan` over T).

    Per step, with state S [Dk, Dv]:
        S ← exp(g_t) · S;   m = Sᵀ k_t;   δ = β_t (v_t − m);   S ← S + k_t δᵀ;   o_t = Sᵀ q_t,
    computed from one product of the old state with [k_t, q_t] (o_t = exp(g_t) Sᵀ q_t +
    δ k_tᵀq_t) and one pass that writes the new state: half the time of the four passes above
    on CPU.

    Args:
      q, k: [B, T, Hk, Dk]; v: [B, T, Hv, Dv]; g, beta: [B, T, Hv].
      initial_state: [B, Hv, Dk, Dv] or None (zeros).
    Returns:
      (o [B, T, Hv, Dv] in v.dtype, final state [B, Hv, Dk, Dv] float32).
    """
    out_dtype = v.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta, use_qk_l2norm)
    state = (
        _zero_state(v, k.shape[-1]) if initial_state is None else initial_state.astype(jnp.float32)
    )

    def step(s, xs):
        q_t, k_t, v_t, g_t, b_t = xs  # [B, H, Dk], [B, H, Dk], [B, H, Dv], [B, H], [B, H]
        decay = jnp.exp(g_t)[..., None]
        read = jnp.einsum("bhkv,bhjk->bhjv", s, jnp.stack([k_t, q_t], axis=2), precision=_HIGHEST)
        delta = (v_t - decay * read[:, :, 0]) * b_t[..., None]
        o_t = decay * read[:, :, 1] + jnp.sum(k_t * q_t, axis=-1, keepdims=True) * delta
        return decay[..., None] * s + k_t[..., :, None] * delta[..., None, :], o_t

    if q.shape[1] == 1:  # one decode token: no loop (a one-trip while loop costs more than its step)
        state, o = step(state, tuple(a[:, 0] for a in (q, k, v, g, beta)))
        return o[:, None].astype(out_dtype), state
    time_major = tuple(jnp.moveaxis(a, 1, 0) for a in (q, k, v, g, beta))
    state, o = jax.lax.scan(step, state, time_major)
    return jnp.moveaxis(o, 0, 1).astype(out_dtype), state


def _unit_lower_inverse(a: jax.Array) -> jax.Array:
    """(I + A)^-1 for strictly lower-triangular A [..., L, L], by matrix products only.

    A is nilpotent (A^L = 0), so (I + A)^-1 = sum_k (-A)^k = (I + N)(I + N^2)(I + N^4)...(I + N^(L/2))
    with N = -A: log2(L) squarings instead of a triangular solve. Products run on the MXU / tensor
    cores, and XLA:CPU's batched triangular solve is avoided: on a 2-thread pool two concurrent
    solves each wait for the other's worker (a deadlock seen on jaxlib 0.10).
    """
    n = -a
    eye = jnp.eye(a.shape[-1], dtype=a.dtype)
    inverse = eye + n
    power = n
    for _ in range(max(int(np.ceil(np.log2(a.shape[-1]))) - 1, 0)):
        power = jnp.matmul(power, power, precision=_HIGHEST)
        inverse = inverse + jnp.matmul(inverse, power, precision=_HIGHEST)
    return inverse


def chunk_gated_delta_rule(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    g: jax.Array,
    beta: jax.Array,
    initial_state: jax.Array | None = None,
    *,
    chunk_size: int = 64,
    use_qk_l2norm: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """Chunked gated delta rule; equal to `recurrent_gated_delta_rule` up to rounding.

    T is zero-padded to a multiple of the chunk length L (β = g = 0 there, so padding neither
    writes nor decays the state). Within a chunk (positions i, j < L):

        G = cumsum(g)                                   decay from the chunk start, [L]
        P_ij = exp(G_i − G_j) if j ≤ i else 0           pairwise decay, [L, L]
        A = ((β ⊙ K) Kᵀ) ⊙ P;   M = I + strictly_lower(A)
        U = M⁻¹ (β ⊙ V)          "value_intra", [L, Dv]
        W = M⁻¹ (β ⊙ K ⊙ exp(G)) "k_cumdecay", [L, Dk]
        intra = (Q Kᵀ) ⊙ P       causal in-chunk attention incl. the diagonal

    Across chunks, carrying S (the initial state, then each chunk's result):

        V' = U − W S;   O = (Q ⊙ exp(G)) S + intra V';   S ← exp(G_L) S + (K ⊙ exp(G_L − G))ᵀ V'.

    Every exponent is ≤ 0 (g ≤ 0), so nothing overflows.

    Args:
      q, k: [B, T, Hk, Dk]; v: [B, T, Hv, Dv]; g, beta: [B, T, Hv].
      initial_state: [B, Hv, Dk, Dv] or None (zeros).
      chunk_size: L.
    Returns:
      (o [B, T, Hv, Dv] in v.dtype, final state [B, Hv, Dk, Dv] float32).
    """
    out_dtype = v.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta, use_qk_l2norm)
    b, t, h, dk = k.shape
    dv = v.shape[-1]
    state = _zero_state(v, dk) if initial_state is None else initial_state.astype(jnp.float32)
    pad = (-t) % chunk_size
    if pad:
        q, k, v = (jnp.pad(a, ((0, 0), (0, pad), (0, 0), (0, 0))) for a in (q, k, v))
        g, beta = (jnp.pad(a, ((0, 0), (0, pad), (0, 0))) for a in (g, beta))
    n = (t + pad) // chunk_size

    def chunked(a):  # [B, N·L, H, ...] -> [B, H, N, L, ...]
        a = a.reshape(b, n, chunk_size, h, *a.shape[3:])
        return jnp.moveaxis(a, 3, 1)

    q, k, v, g, beta = (chunked(a) for a in (q, k, v, g, beta))
    cum = jnp.cumsum(g, axis=-1)  # G [B, H, N, L]
    lower = jnp.tril(jnp.ones((chunk_size, chunk_size), bool))
    diff = cum[..., :, None] - cum[..., None, :]
    decay = jnp.where(lower, jnp.exp(jnp.where(lower, diff, 0.0)), 0.0)  # P [B, H, N, L, L]

    k_beta = k * beta[..., None]
    v_beta = v * beta[..., None]
    a_mat = jnp.einsum("...id,...jd->...ij", k_beta, k, precision=_HIGHEST) * decay
    inverse = _unit_lower_inverse(jnp.where(jnp.tril(lower, -1), a_mat, 0.0))  # (I + tril(A, -1))^-1
    u = jnp.einsum("...ij,...jd->...id", inverse, v_beta, precision=_HIGHEST)  # [B, H, N, L, Dv]
    w = jnp.einsum("...ij,...jd->...id", inverse, k_beta * jnp.exp(cum)[..., None], precision=_HIGHEST)
    intra = jnp.einsum("...id,...jd->...ij", q, k, precision=_HIGHEST) * decay
    q_decayed = q * jnp.exp(cum)[..., None]
    k_decayed = k * jnp.exp(cum[..., -1:] - cum)[..., None]
    chunk_decay = jnp.exp(cum[..., -1])  # [B, H, N]

    def step(s, xs):
        u_c, w_c, intra_c, q_c, k_c, decay_c = xs
        v_new = u_c - jnp.einsum("bhlk,bhkv->bhlv", w_c, s, precision=_HIGHEST)
        o_c = jnp.einsum("bhlk,bhkv->bhlv", q_c, s, precision=_HIGHEST) + jnp.einsum(
            "bhij,bhjv->bhiv", intra_c, v_new, precision=_HIGHEST
        )
        s = s * decay_c[..., None, None] + jnp.einsum(
            "bhlk,bhlv->bhkv", k_c, v_new, precision=_HIGHEST
        )
        return s, o_c

    chunk_major = tuple(
        jnp.moveaxis(a, 2, 0) for a in (u, w, intra, q_decayed, k_decayed, chunk_decay)
    )
    state, o = jax.lax.scan(step, state, chunk_major)  # o [N, B, H, L, Dv]
    o = jnp.moveaxis(o, 0, 2).reshape(b, h, n * chunk_size, dv)
    o = jnp.moveaxis(o, 1, 2)[:, :t]
    return o.astype(out_dtype), state


def causal_conv1d(
    x: jax.Array, weight: jax.Array, state: jax.Array | None = None, mask: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
    """Causal depthwise conv followed by SiLU, with its decode state.

        y[t, c] = silu(Σ_{j<K} w[c, 0, j] · x̃[t + j, c]),   x̃ = concat(state, x) along time,

    so without a state the K−1 inputs before t = 0 are zeros (HF `causal_conv1d_fn`) and with one
    this is HF `causal_conv1d_update` for any T. Computed in the weight dtype, returned in x.dtype.

    With a mask, masked tokens are skipped as if absent: each row's real tokens are moved to the
    front (order kept), convolved right after the state, and moved back; the new state holds the
    last K−1 real inputs. Padding anywhere (left, right, inside a continuation) thus never enters
    a real token's window or the carried state. Outputs at masked positions are unspecified.

    Args:
      x: [B, T, C] pre-conv inputs.
      weight: [C, 1, K] (torch depthwise `Conv1d` layout).
      state: [B, K−1, C], the pre-conv inputs of the previous K−1 tokens, or None (zeros).
      mask: [B, T] bool, real tokens; None means all real.
    Returns:
      (y [B, T, C], new state [B, K−1, C] in x.dtype).
    """
    kernel = weight.shape[-1]
    b, t, c = x.shape
    if state is None:
        state = jnp.zeros((b, kernel - 1, c), x.dtype)
    if mask is not None and t == 1:
        # One decode token is real or absent: a select keeps absent rows' state, where the
        # general path below would sort, gather and scatter every step.
        y, shifted = causal_conv1d(x, weight, state)
        return y, jnp.where(mask[:, :1, None], shifted, state)
    if mask is not None:
        order = jnp.argsort(~mask, axis=1, stable=True)  # real tokens first
        x = jnp.take_along_axis(x, order[..., None], axis=1)
        num_real = jnp.sum(mask, axis=1, dtype=jnp.int32)
        x = jnp.where((jnp.arange(t) < num_real[:, None])[..., None], x, 0)
    padded = jnp.concatenate([state.astype(weight.dtype), x.astype(weight.dtype)], axis=1)
    w = weight[:, 0, :]  # [C, K]
    y = jax.nn.silu(sum(padded[:, j : j + t, :] * w[:, j] for j in range(kernel))).astype(x.dtype)
    if mask is None:
        return y, padded[:, t:, :].astype(x.dtype)
    # Rows of x̃ after the last real token are the window of the new state.
    window = num_real[:, None] + jnp.arange(kernel - 1)
    new_state = jnp.take_along_axis(padded, window[..., None], axis=1).astype(x.dtype)
    y = jnp.take_along_axis(y, jnp.argsort(order, axis=1)[..., None], axis=1)
    return y, new_state
