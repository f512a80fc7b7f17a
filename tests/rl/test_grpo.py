"""GRPO numerics against an independent NumPy reference on random inputs."""

import jax
import numpy as np
import pytest

from intraskill_jax.rl.grpo import (
    LossConfig,
    group_advantages,
    kl_penalty,
    nonzero_variance_groups,
    policy_loss,
    sum_metrics,
)


def np_advantages(r, g, scale):
    r = r.reshape(-1, g)
    out = r - r.mean(1, keepdims=True)
    if scale:
        out = out / (r.std(1, ddof=1, keepdims=True) + 1e-6)
    return out.reshape(-1)


def np_loss(lp, old, adv, mask, cfg: LossConfig, rollout=None, ref=None, n_tok=None, n_seq=None):
    B, T = lp.shape
    per = np.zeros((B, T))
    for b in range(B):
        for t in range(T):
            a = adv[b]
            rho = np.exp(np.clip(lp[b, t] - old[b, t], -20, 20))
            l = max(-a * rho, -a * min(max(rho, 1 - cfg.clip_low), 1 + cfg.clip_high))
            if cfg.dual_clip is not None and a < 0:
                l = min(l, -a * cfg.dual_clip)
            if cfg.tis_cap is not None and rollout is not None:
                l *= min(np.exp(old[b, t] - rollout[b, t]), cfg.tis_cap)
            if cfg.kl_coef > 0:
                d = lp[b, t] - ref[b, t]
                k = {"k1": d, "k2": 0.5 * d * d, "k3": np.exp(-d) + d - 1}[cfg.kl_estimator]
                l += cfg.kl_coef * k
            per[b, t] = l
    if cfg.aggregation == "token-mean":
        return (per * mask).sum() / (mask.sum() if n_tok is None else n_tok)
    rows = [(per[b] * mask[b]).sum() / mask[b].sum() for b in range(B) if mask[b].sum() > 0]
    return sum(rows) / (len(rows) if n_seq is None else n_seq)


def random_batch(seed, B=8, T=13):
    rng = np.random.default_rng(seed)
    lp = rng.normal(-1.5, 0.5, (B, T)).astype(np.float32)
    old = (lp + rng.normal(0, 0.3, (B, T))).astype(np.float32)
    rollout = (old + rng.normal(0, 0.5, (B, T))).astype(np.float32)
    ref = (lp + rng.normal(0, 0.2, (B, T))).astype(np.float32)
    adv = rng.normal(0, 1, B).astype(np.float32)
    mask = (rng.random((B, T)) < 0.7).astype(np.float32)
    mask[0] = 0  # an empty row must not count as a sequence
    return lp, old, rollout, ref, adv, mask


@pytest.mark.parametrize("scale", [True, False])
def test_group_advantages_match_numpy(scale):
    r = np.random.default_rng(0).random(32).astype(np.float32)
    np.testing.assert_allclose(group_advantages(r, 8, scale_by_std=scale), np_advantages(r, 8, scale), rtol=1e-5, atol=1e-6)


def test_hand_computed_advantages_and_zero_variance_groups():
    r = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0], np.float32)
    # group 1: mean .5, std(ddof=1) = .57735 -> +-0.866; group 2: all equal -> zero advantage.
    np.testing.assert_allclose(group_advantages(r, 4), [0.866025, -0.866025, -0.866025, 0.866025, 0, 0, 0, 0], atol=1e-5)
    assert nonzero_variance_groups(r, 4).tolist() == [True, False]


CONFIGS = [
    LossConfig(),
    LossConfig(dual_clip=None, tis_cap=None),
    LossConfig(aggregation="seq-mean-token-mean", kl_coef=0.05, kl_estimator="k1"),
    LossConfig(kl_coef=0.1, kl_estimator="k2", clip_low=0.1, clip_high=0.1, dual_clip=2.0),
    LossConfig(kl_coef=0.01, kl_estimator="k3", tis_cap=1.5, aggregation="seq-mean-token-mean"),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=range(len(CONFIGS)))
@pytest.mark.parametrize("seed", [0, 1])
def test_policy_loss_matches_numpy(cfg, seed):
    lp, old, rollout, ref, adv, mask = random_batch(seed)
    out = policy_loss(lp, old, adv, mask, cfg, rollout_logprobs=rollout, ref_logprobs=ref)
    np.testing.assert_allclose(out.loss, np_loss(lp, old, adv, mask, cfg, rollout, ref), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_micro_batches_sum_to_the_global_loss(aggregation):
    cfg = LossConfig(aggregation=aggregation)
    lp, old, rollout, ref, adv, mask = random_batch(3, B=12)
    full = policy_loss(lp, old, adv, mask, cfg, rollout_logprobs=rollout)
    n_tok, n_seq = mask.sum(), (mask.sum(1) > 0).sum()
    parts = [
        policy_loss(lp[s], old[s], adv[s], mask[s], cfg, rollout_logprobs=rollout[s], num_tokens=n_tok, num_sequences=n_seq)
        for s in (slice(0, 3), slice(3, 10), slice(10, 12))
    ]
    np.testing.assert_allclose(sum(p.loss for p in parts), full.loss, rtol=1e-5)
    merged = sum_metrics([p.metrics for p in parts])
    for k in ("pg_loss", "clipfrac_low", "clipfrac_high", "ppo_kl", "tis_weight_mean"):
        np.testing.assert_allclose(merged[k].mean, full.metrics[k].mean, rtol=1e-5, atol=1e-7)


def test_on_policy_gradient_is_minus_advantage_weighted_score():
    import jax
    import jax.numpy as jnp

    lp, _, _, _, adv, mask = random_batch(5)
    cfg = LossConfig(tis_cap=None)
    g = jax.grad(lambda x: policy_loss(x, None, adv, mask, cfg).loss)(jnp.asarray(lp))
    # rho = 1 with old = stop_gradient(logp): d loss / d logp_t = -A m_t / N
    np.testing.assert_allclose(g, -adv[:, None] * mask / mask.sum(), rtol=1e-5, atol=1e-7)


def test_metrics_match_numpy_definitions():
    lp, old, rollout, _, adv, mask = random_batch(7)
    cfg = LossConfig(clip_low=0.1, clip_high=0.1)
    m = policy_loss(lp, old, adv, mask, cfg, rollout_logprobs=rollout).metrics
    rho = np.exp(lp - old)
    sel = mask > 0
    a = np.broadcast_to(adv[:, None], rho.shape)
    np.testing.assert_allclose(m["clipfrac_low"].mean, ((rho < 0.9) & (a < 0))[sel].mean(), atol=1e-6)
    np.testing.assert_allclose(m["clipfrac_high"].mean, ((rho > 1.1) & (a > 0))[sel].mean(), atol=1e-6)
    np.testing.assert_allclose(m["ppo_kl"].mean, (old - lp)[sel].mean(), rtol=1e-5)
    np.testing.assert_allclose(m["rollout_logp_abs_diff"].mean, np.abs(old - rollout)[sel].mean(), rtol=1e-5)
    assert float(m["tokens"].total) == mask.sum()


def test_bad_configs_are_rejected():
    for kw in ({"clip_low": 1.5}, {"dual_clip": 0.5}, {"kl_coef": -1}, {"aggregation": "sum"}, {"tis_cap": 0}):
        with pytest.raises(ValueError):
            LossConfig(**kw)
    lp, old, _, _, adv, mask = random_batch(0)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(lp, old, adv, mask, LossConfig(kl_coef=0.1))


def np_kl(lp, ref, estimator):
    """The estimators as the papers write them: k3 is the GRPO paper's ref/pi - log(ref/pi) - 1."""
    ratio = np.exp(ref.astype(np.float64) - lp.astype(np.float64))  # ref / pi of the sampled token
    return {"k1": -np.log(ratio), "k2": 0.5 * np.log(ratio) ** 2, "k3": ratio - np.log(ratio) - 1}[estimator]


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_estimators_match_numpy(estimator):
    lp, _, _, ref, _, _ = random_batch(3)
    ref = ref + np.random.default_rng(4).normal(0, 1.0, ref.shape).astype(np.float32)  # also far from pi
    np.testing.assert_allclose(kl_penalty(lp, ref, estimator), np_kl(lp, ref, estimator), rtol=1e-5, atol=1e-6)


def test_k3_is_nonnegative_zero_at_the_reference_and_its_gradient_is_one_minus_the_ratio():
    lp, _, _, ref, _, _ = random_batch(5)
    k3 = np.asarray(kl_penalty(lp, ref, "k3"))
    assert (k3 >= 0).all() and np.all(np.asarray(kl_penalty(lp, lp, "k3")) == 0)
    # d k3 / d log pi = 1 - ref/pi: pulls pi down where it exceeds ref, up where it falls short.
    grad = jax.grad(lambda x: kl_penalty(x, ref, "k3").sum())(lp)
    np.testing.assert_allclose(grad, 1 - np.exp(ref - lp), rtol=1e-5, atol=1e-6)
