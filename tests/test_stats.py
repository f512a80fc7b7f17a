"""Tests for intraskill_jax/stats.py against statsmodels, a NumPy reference and hand counts."""

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import stats as sps

from intraskill_jax import stats


def _data(n=200, k=10, seed=0):
    rng = np.random.default_rng(seed)
    masks = (rng.random((n, k)) < 0.5).astype(float)
    beta = np.linspace(-0.1, 0.1, k)
    p_r = np.clip(0.5 + masks @ beta, 0, 1)
    deltas = (rng.random(n) < p_r).astype(float) - (rng.random(n) < 0.5).astype(float)
    return deltas, masks


def _numpy_hc3(y, x):
    """Normal equations + the HC3 sandwich (X'X)^-1 X' diag(e^2 / (1-h)^2) X (X'X)^-1."""
    xtx_inv = np.linalg.inv(x.T @ x)
    beta = xtx_inv @ x.T @ y
    e = y - x @ beta
    h = np.einsum("ij,jk,ik->i", x, xtx_inv, x)
    meat = (x * (e**2 / (1 - h) ** 2)[:, None]).T @ x
    return beta, xtx_inv @ meat @ xtx_inv


@pytest.mark.parametrize("seed,n,k", [(0, 200, 10), (1, 60, 3), (2, 400, 12)])
def test_contributions_equal_statsmodels_and_numpy(seed, n, k):
    y, x = _data(n, k, seed)
    got = stats.chunk_contributions(y, x)
    ref = sm.OLS(y, x).fit(cov_type="HC3")
    np.testing.assert_allclose(got.beta, ref.params, rtol=1e-12)
    np.testing.assert_allclose(got.se, ref.bse, rtol=1e-12)
    np.testing.assert_allclose(got.p, ref.pvalues, rtol=1e-10)
    np.testing.assert_allclose(np.c_[got.ci_low, got.ci_high], ref.conf_int(0.05), rtol=1e-12)
    assert got.n == n
    beta, cov = _numpy_hc3(y, x)
    np.testing.assert_allclose(got.beta, beta, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got.cov, cov, rtol=1e-9, atol=1e-14)
    z = sps.norm.ppf(0.975)
    np.testing.assert_allclose(got.ci_low, beta - z * np.sqrt(np.diag(cov)), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(
        got.p, 2 * sps.norm.sf(np.abs(beta) / np.sqrt(np.diag(cov))), rtol=1e-8
    )


def test_no_intercept_recovers_known_betas_exactly_without_noise():
    rng = np.random.default_rng(3)
    x = (rng.random((50, 4)) < 0.5).astype(float)
    beta = np.array([0.3, -0.2, 0.0, 0.1])
    got = stats.chunk_contributions(x @ beta, x)
    np.testing.assert_allclose(got.beta, beta, atol=1e-12)


def test_cluster_and_t_options_match_statsmodels():
    y, x = _data(120, 4, 4)
    groups = np.repeat(np.arange(40), 3)
    got = stats.chunk_contributions(y, x, cov_type="cluster", groups=groups, use_t=True, alpha=0.1)
    ref = sm.OLS(y, x).fit(cov_type="cluster", cov_kwds={"groups": groups}, use_t=True)
    np.testing.assert_allclose(got.se, ref.bse, rtol=1e-12)
    np.testing.assert_allclose(got.ci_high, ref.conf_int(0.1)[:, 1], rtol=1e-12)


def test_unidentified_designs_raise():
    y, x = _data(50, 3, 5)
    x[:, 1] = 0
    with pytest.raises(ValueError, match="not identified"):
        stats.chunk_contributions(y, x)
    x = np.eye(3)[[0, 1, 1, 2, 2]]  # chunk 0 is on in one task only: that task alone sets beta_0
    with pytest.raises(ValueError, match="leverage 1"):
        stats.chunk_contributions(np.arange(5.0), x)
    with pytest.raises(ValueError, match="masks"):
        stats.chunk_contributions(np.ones(5), np.ones(5))
    with pytest.raises(ValueError, match="groups"):
        stats.chunk_contributions(*_data(50, 2, 6), cov_type="cluster")


def test_additivity_check():
    y, x = _data(300, 5, 7)
    c = stats.chunk_contributions(y, x)
    full = np.full(300, c.beta.sum()) + np.tile([0.5, -0.5], 150)
    a = stats.additivity_check(c, full)
    assert a.predicted == pytest.approx(c.beta.sum())
    assert a.predicted_se == pytest.approx(np.sqrt(c.cov.sum()))
    assert a.observed == pytest.approx(c.beta.sum()) and a.difference == pytest.approx(
        0.0, abs=1e-12
    )
    assert a.consistent and a.n_full == 300
    far = stats.additivity_check(c, full + 1.0)
    assert not far.consistent and far.p < 1e-6


def test_benjamini_hochberg_by_hand():
    p = np.array([0.001, 0.008, 0.039, 0.041, 0.042, 0.06, 0.074, 0.205])
    reject, adj = stats.benjamini_hochberg(p, 0.05)
    # adjusted p_(i) = min_{j>=i} p_(j) * m / j
    m = len(p)
    hand = np.minimum.accumulate((p * m / np.arange(1, m + 1))[::-1])[::-1]
    np.testing.assert_allclose(adj, np.minimum(hand, 1))
    np.testing.assert_array_equal(reject, [True, True, False, False, False, False, False, False])
    assert stats.benjamini_hochberg([], 0.05)[0].size == 0


def test_paired_bootstrap_interval():
    rng = np.random.default_rng(8)
    b = (rng.random(400) < 0.5).astype(float)
    a = np.where(rng.random(400) < 0.8, b, 1 - b)
    a[:30] = 1.0
    d = stats.paired_bootstrap(a, b, n_resamples=2000, seed=1)
    assert d.difference == pytest.approx(np.mean(a - b))
    clt = np.std(a - b, ddof=1) / np.sqrt(400) * 1.96
    assert d.ci_low < d.difference < d.ci_high
    assert (d.ci_high - d.ci_low) == pytest.approx(2 * clt, rel=0.15)
    same = stats.paired_bootstrap(b, b)
    assert (same.difference, same.ci_low, same.ci_high, same.method) == (
        0.0,
        0.0,
        0.0,
        "degenerate",
    )
    with pytest.raises(ValueError):
        stats.paired_bootstrap(a, b[:10])


def test_mcnemar_exact_is_a_binomial_test_on_discordant_pairs():
    a = np.array([1] * 50 + [1] * 15 + [0] * 5 + [0] * 30, bool)
    b = np.array([1] * 50 + [0] * 15 + [1] * 5 + [0] * 30, bool)
    r = stats.mcnemar_exact(a, b)
    assert (r.n11, r.n10, r.n01, r.n00) == (50, 15, 5, 30)
    assert r.statistic == 5 and r.effect == pytest.approx(0.1)
    assert r.p == pytest.approx(sps.binomtest(5, 20, 0.5).pvalue)
