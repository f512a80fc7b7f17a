"""GRPO numerics as pure, jittable functions of arrays (no model, no Python state).

Shapes: B sequences (episodes) of T tokens; G siblings per group, so B = groups * G.

    advantages   A_i = (r_i - mean_g) / (std_g + eps)        (Dr.GRPO: A_i = r_i - mean_g)
    ratio        rho_t = exp(clip(logp_t - old_logp_t, -20, 20))
    surrogate    l_t = max(-A rho_t, -A clip(rho_t, 1 - eps_low, 1 + eps_high))   (clip-higher)
    dual clip    l_t = min(l_t, c |A|) for A < 0                                     (Ye et al. 2020)
    TIS          l_t *= sg(min(exp(old_logp_t - rollout_logp_t), C))   rollout/trainer mismatch
    KL           l_t += beta * k(logp_t - ref_logp_t),  k1 = d, k2 = d^2/2, k3 = exp(-d) + d - 1
    aggregate    token-mean:            sum_bt l m / N_tokens
                 seq-mean-token-mean:   sum_b (sum_t l m / sum_t m) / N_seqs

The denominators N_tokens / N_seqs are arguments: pass the counts of the whole optimizer batch and
the micro-batch losses *sum* to the exact global mean under gradient accumulation and data
parallelism (a mean of micro-batch means would weight short micro-batches up).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp

Aggregation = Literal["token-mean", "seq-mean-token-mean"]
KLEstimator = Literal["k1", "k2", "k3"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LossConfig:
    """Policy-loss options (hashable: a static argument of the jitted loss).

    Attributes:
      clip_low / clip_high: PPO ratio clip below / above 1 (clip-higher: clip_high > clip_low).
      dual_clip: c of dual-clip for negative advantages (None: off); must be > 1.
      kl_coef: beta of the KL penalty to the reference policy (0: off, no reference needed).
      kl_estimator: k1, k2 or k3 (Schulman's low-variance estimator).
      tis_cap: cap C of truncated importance sampling between trainer and rollout log-probs
        (None: off).
      aggregation: 'token-mean' (DAPO, default) or 'seq-mean-token-mean' (original GRPO).
    """

    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = 3.0
    kl_coef: float = 0.0
    kl_estimator: KLEstimator = "k3"
    tis_cap: float | None = 2.0
    aggregation: Aggregation = "token-mean"

    def __post_init__(self) -> None:
        if not (0 < self.clip_low < 1 and self.clip_high > 0):
            raise ValueError(f"need 0 < clip_low < 1 and clip_high > 0, got {self.clip_low}, {self.clip_high}")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1 (or None to disable), got {self.dual_clip}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.kl_estimator not in ("k1", "k2", "k3"):
            raise ValueError(f"kl_estimator must be k1, k2 or k3, got {self.kl_estimator!r}")
        if self.tis_cap is not None and self.tis_cap <= 0:
            raise ValueError(f"tis_cap must be > 0 (or None to disable), got {self.tis_cap}")
        if self.aggregation not in ("token-mean", "seq-mean-token-mean"):
            raise ValueError(f"aggregation must be 'token-mean' or 'seq-mean-token-mean', got {self.aggregation!r}")


class Weighted(NamedTuple):
    """A metric as (sum, weight): reduces exactly across micro-batches and devices."""

    total: jax.Array
    weight: jax.Array

    @property
    def mean(self) -> jax.Array:
        return self.total / jnp.maximum(self.weight, 1e-12)


def sum_metrics(parts: list[dict[str, Weighted]]) -> dict[str, Weighted]:
    """Adds per-micro-batch metrics; `.mean` of the result is the global mean."""
    return {k: Weighted(sum(p[k].total for p in parts), sum(p[k].weight for p in parts)) for k in parts[0]}


# -- advantages and filtering ------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("group_size", "scale_by_std"))
def group_advantages(rewards: jax.Array, group_size: int, *, scale_by_std: bool = True, eps: float = 1e-6) -> jax.Array:
    """Group-relative advantages. rewards: [B] with siblings contiguous; returns [B].

    The std is the unbiased one (ddof=1), as in Tunix; `scale_by_std=False` is Dr.GRPO.
    """
    r = rewards.reshape(-1, group_size).astype(jnp.float32)
    centred = r - r.mean(axis=1, keepdims=True)
    if scale_by_std:
        centred = centred / (r.std(axis=1, ddof=1, keepdims=True) + eps)
    return centred.reshape(-1)


@functools.partial(jax.jit, static_argnames=("group_size",))
def nonzero_variance_groups(rewards: jax.Array, group_size: int, *, tol: float = 1e-6) -> jax.Array:
    """[groups] bool: True where the siblings' rewards differ (the group carries a gradient)."""
    r = rewards.reshape(-1, group_size)
    return (r.max(axis=1) - r.min(axis=1)) > tol


# -- the policy loss ---------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("estimator",))
def kl_penalty(logprobs: jax.Array, ref_logprobs: jax.Array, estimator: KLEstimator) -> jax.Array:
    """Per-token estimate of KL(pi || ref) from the log-probs of the sampled tokens (Schulman 2020).

    With d = log pi - log ref: k1 = d; k2 = d^2 / 2; k3 = ref/pi - log(ref/pi) - 1 = exp(-d) + d - 1,
    the GRPO paper's estimator (Shao et al. 2024, eq. 4): unbiased and never negative.
    """
    d = logprobs - ref_logprobs
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d * d
    return jnp.exp(-d) + d - 1.0


class LossOutput(NamedTuple):
    loss: jax.Array  # scalar; sums across micro-batches to the global loss
    metrics: dict[str, Weighted]


@functools.partial(jax.jit, static_argnames=("config",))
def policy_loss(
    logprobs: jax.Array,
    old_logprobs: jax.Array | None,
    advantages: jax.Array,
    loss_mask: jax.Array,
    config: LossConfig,
    *,
    rollout_logprobs: jax.Array | None = None,
    ref_logprobs: jax.Array | None = None,
    entropy: jax.Array | None = None,
    num_tokens: jax.Array | float | None = None,
    num_sequences: jax.Array | float | None = None,
) -> LossOutput:
    """GRPO policy loss and its metrics (see the module docstring for the formulas).

    Args:
      logprobs: [B, T] current policy log-probs of the taken tokens (differentiable).
      old_logprobs: [B, T] trainer log-probs at the rollout weights; None: on-policy (rho = 1).
      advantages: [B] per-sequence advantages.
      loss_mask: [B, T] 1 on sampled (trainable) tokens.
      rollout_logprobs: [B, T] the sampler's log-probs (for TIS and the mismatch metric).
      ref_logprobs: [B, T] reference policy log-probs (needed when kl_coef > 0).
      entropy: [B, T] per-token entropy, only logged.
      num_tokens / num_sequences: global denominators (defaults: this batch's counts).
    """
    mask = loss_mask.astype(jnp.float32)
    if old_logprobs is None:
        old_logprobs = jax.lax.stop_gradient(logprobs)
    adv = advantages.astype(jnp.float32)[:, None]
    log_ratio = jnp.clip(logprobs - old_logprobs, -20.0, 20.0)
    ratio = jnp.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * jnp.clip(ratio, 1.0 - config.clip_low, 1.0 + config.clip_high)
    per_token = jnp.maximum(unclipped, clipped)
    dual_active = jnp.zeros_like(per_token, dtype=bool)
    if config.dual_clip is not None:
        bound = -adv * config.dual_clip  # positive where A < 0
        dual_active = (adv < 0) & (per_token > bound)
        per_token = jnp.where(adv < 0, jnp.minimum(per_token, bound), per_token)

    tis_weight = jnp.ones_like(per_token)
    if config.tis_cap is not None and rollout_logprobs is not None:
        tis_weight = jax.lax.stop_gradient(
            jnp.minimum(jnp.exp(jnp.clip(old_logprobs - rollout_logprobs, -20.0, 20.0)), config.tis_cap)
        )
        per_token = per_token * tis_weight

    kl = None
    if config.kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        kl = kl_penalty(logprobs, ref_logprobs, config.kl_estimator)
        per_token = per_token + config.kl_coef * kl

    tokens = mask.sum()
    seq_tokens = mask.sum(axis=1)
    if config.aggregation == "token-mean":
        denom = tokens if num_tokens is None else num_tokens
        loss = (per_token * mask).sum() / jnp.maximum(denom, 1.0)
    else:
        denom = (seq_tokens > 0).sum() if num_sequences is None else num_sequences
        per_seq = (per_token * mask).sum(axis=1) / jnp.maximum(seq_tokens, 1.0)
        loss = per_seq.sum() / jnp.maximum(denom, 1.0)

    def tok(x: jax.Array) -> Weighted:
        return Weighted((x.astype(jnp.float32) * mask).sum(), tokens)

    pg = jnp.maximum(unclipped, clipped)
    metrics = {
        "pg_loss": tok(pg),
        "clipfrac_low": tok((ratio < 1.0 - config.clip_low) & (adv < 0)),
        "clipfrac_high": tok((ratio > 1.0 + config.clip_high) & (adv > 0)),
        "dual_clip_frac": tok(dual_active),
        "ppo_kl": tok(-log_ratio),
        "ratio_mean": tok(ratio),
        "tis_weight_mean": tok(tis_weight),
        "tokens": Weighted(tokens, jnp.float32(1.0)),
    }
    if config.tis_cap is not None and rollout_logprobs is not None:
        metrics["tis_clip_frac"] = tok(jnp.exp(old_logprobs - rollout_logprobs) > config.tis_cap)
    if rollout_logprobs is not None:
        metrics["rollout_logp_abs_diff"] = tok(jnp.abs(old_logprobs - rollout_logprobs))
    if kl is not None:
        metrics["kl"] = tok(kl)
    if entropy is not None:
        metrics["entropy"] = tok(entropy)
    return LossOutput(loss, metrics)
