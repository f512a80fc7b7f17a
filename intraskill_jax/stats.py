"""Statistics for the skill gate and the evaluation: chunk contributions, additivity, BH,
paired bootstrap, exact McNemar. Thin, typed wrappers over statsmodels and scipy.

Chunk contributions are the no-intercept main-effect regression of the paired gain on the mask

    R_i - B_i = C_i^T beta + e_i,   C_i in {0,1}^K (which chunks were on for task i),

fitted by OLS with heteroskedasticity-robust (HC3) errors: outcomes are bounded, so the variance
of e_i depends on C_i. No intercept is exact only because an all-zero mask renders the bare prompt
byte for byte (see `skills/bank.py`). With K chunks on at p = 0.5, SE(beta_j) ~ 2 sigma / sqrt(n),
sigma^2 = Var(R_i - B_i) (the reference, 5.2).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import statsmodels.api as sm
from scipy import stats as sps
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests


@dataclasses.dataclass(frozen=True)
class Contributions:
    """Per-column estimates of a contribution fit; arrays are [K]."""

    beta: np.ndarray
    se: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    p: np.ndarray
    n: int
    cov: np.ndarray  # [K, K] robust covariance of beta
    cov_type: str
    alpha: float
    names: tuple[str, ...] = ()

    def row(self, j: int) -> dict[str, float]:
        """Column j as a JSON-able mapping (what the ledger stores)."""
        return {
            "beta": float(self.beta[j]),
            "se": float(self.se[j]),
            "ci_low": float(self.ci_low[j]),
            "ci_high": float(self.ci_high[j]),
            "p": float(self.p[j]),
            "n": int(self.n),
        }


def chunk_contributions(
    deltas: Sequence[float] | np.ndarray,
    masks: Sequence[Sequence[int]] | np.ndarray,
    *,
    cov_type: str = "HC3",
    alpha: float = 0.05,
    groups: Sequence[int] | np.ndarray | None = None,
    use_t: bool = False,
    names: Sequence[str] = (),
) -> Contributions:
    """No-intercept OLS of `deltas` [n] on `masks` [n, K] with robust errors (statsmodels).

    Args:
      deltas: R_i - B_i, one per validation task.
      masks: the 0/1 inclusion of each column (chunk or proposal) in the random-mask arm.
      cov_type: statsmodels robust covariance ('HC0'..'HC3'; 'cluster' needs `groups`).
      alpha: 1 - confidence level of the intervals.
      groups: integer cluster ids (task ids when a task has several masks) for cov_type='cluster'.
      use_t: t instead of normal inference (statsmodels' default for robust errors is normal).
      names: column names carried into the result.

    Raises:
      ValueError: shapes disagree, a column never varies so beta is not identified, or a single
        task determines a coefficient (leverage 1 makes HC3 infinite).
    """
    y = np.asarray(deltas, np.float64)
    x = np.asarray(masks, np.float64)
    if y.ndim != 1 or x.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(f"need deltas [n] and masks [n, K]; got {y.shape} and {x.shape}")
    n, k = x.shape
    if names and len(names) != k:
        raise ValueError(f"{len(names)} names for {k} mask columns")
    if n <= k:
        raise ValueError(f"need more tasks than columns to fit {k} contributions; got n={n}")
    if np.linalg.matrix_rank(x) < k:
        raise ValueError(
            "mask columns are collinear (a chunk never on, or two chunks always together); "
            "beta is not identified: draw more or other masks"
        )
    if cov_type == "HC3":
        leverage = np.einsum("ij,jk,ik->i", x, np.linalg.inv(x.T @ x), x)
        if leverage.max() > 1 - 1e-10:
            raise ValueError(
                "a single task determines a coefficient (leverage 1), so HC3 is undefined; "
                "use more tasks or masks"
            )
    cov_kwds = None
    if cov_type == "cluster":
        if groups is None:
            raise ValueError("cov_type='cluster' needs groups (e.g. the task id of each row)")
        cov_kwds = {"groups": np.asarray(groups)}
    fit = sm.OLS(y, x).fit(cov_type=cov_type, cov_kwds=cov_kwds, use_t=use_t)
    ci = np.asarray(fit.conf_int(alpha=alpha))
    return Contributions(
        beta=np.asarray(fit.params),
        se=np.asarray(fit.bse),
        ci_low=ci[:, 0],
        ci_high=ci[:, 1],
        p=np.asarray(fit.pvalues),
        n=n,
        cov=np.asarray(fit.cov_params()),
        cov_type=cov_type,
        alpha=alpha,
        names=tuple(names),
    )


@dataclasses.dataclass(frozen=True)
class Additivity:
    """Sum of betas (the regression's prediction for all columns on) vs the observed full-skill gain."""

    predicted: float
    predicted_se: float
    observed: float
    observed_se: float
    difference: float  # observed - predicted
    ci_low: float
    ci_high: float
    p: float
    n_full: int

    @property
    def consistent(self) -> bool:
        """True when the interval of the difference covers 0 (no evidence of interaction)."""
        return self.ci_low <= 0.0 <= self.ci_high


def additivity_check(
    contrib: Contributions, full_deltas: Sequence[float] | np.ndarray
) -> Additivity:
    """Compares sum_j beta_j with mean(F_i - B_i) from a full-skill arm.

    The two estimates are treated as independent. On the same tasks both contain -B_i, so they
    covary positively and the true SE of the difference is smaller: the interval is conservative.
    """
    d = np.asarray(full_deltas, np.float64)
    if d.ndim != 1 or d.size < 2:
        raise ValueError(f"need at least two full-skill deltas, got shape {d.shape}")
    ones = np.ones(contrib.beta.shape[0])
    predicted = float(contrib.beta.sum())
    predicted_se = float(np.sqrt(ones @ contrib.cov @ ones))
    observed = float(d.mean())
    observed_se = float(d.std(ddof=1) / np.sqrt(d.size))
    diff = observed - predicted
    se = float(np.hypot(predicted_se, observed_se))
    z = sps.norm.ppf(1 - contrib.alpha / 2)
    p = float(2 * sps.norm.sf(abs(diff) / se)) if se > 0 else float(diff == 0.0)
    return Additivity(
        predicted,
        predicted_se,
        observed,
        observed_se,
        diff,
        diff - z * se,
        diff + z * se,
        p,
        d.size,
    )


def benjamini_hochberg(
    p: Sequence[float] | np.ndarray, q: float = 0.05
) -> tuple[np.ndarray, np.ndarray]:
    """(reject [K] bool, BH-adjusted p [K]) at false-discovery rate q."""
    p = np.asarray(p, np.float64)
    if p.size == 0:
        return np.zeros(0, bool), np.zeros(0)
    reject, adjusted, _, _ = multipletests(p, alpha=q, method="fdr_bh")
    return np.asarray(reject), np.asarray(adjusted)


@dataclasses.dataclass(frozen=True)
class PairedDifference:
    difference: float  # mean(a) - mean(b)
    ci_low: float
    ci_high: float
    n: int
    method: str


def paired_bootstrap(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    *,
    confidence: float = 0.95,
    n_resamples: int = 9999,
    method: str = "BCa",
    seed: int = 0,
) -> PairedDifference:
    """Bootstrap interval of mean(a - b) resampling tasks (scipy, paired).

    `a[i]` and `b[i]` are one task's outcomes (success or strict reward) under two conditions;
    average over seeds within a task before calling. Identical differences give a zero-width interval.
    """
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size < 2:
        raise ValueError(
            f"need two paired 1-D samples of equal length >= 2; got {a.shape} and {b.shape}"
        )
    d = a - b
    if np.all(d == d[0]):
        return PairedDifference(float(d[0]), float(d[0]), float(d[0]), d.size, "degenerate")
    res = sps.bootstrap(
        (a, b),
        lambda x, y, axis=-1: np.mean(x - y, axis=axis),
        paired=True,
        vectorized=True,
        confidence_level=confidence,
        n_resamples=n_resamples,
        method=method,
        rng=np.random.default_rng(seed),
    )
    return PairedDifference(
        float(d.mean()),
        float(res.confidence_interval.low),
        float(res.confidence_interval.high),
        d.size,
        method,
    )


@dataclasses.dataclass(frozen=True)
class McNemarResult:
    """Exact McNemar on paired binary outcomes; n10 = a succeeded where b failed."""

    n11: int
    n10: int
    n01: int
    n00: int
    statistic: float
    p: float

    @property
    def n(self) -> int:
        return self.n11 + self.n10 + self.n01 + self.n00

    @property
    def effect(self) -> float:
        return (self.n10 - self.n01) / self.n if self.n else 0.0


def mcnemar_exact(a: Sequence[bool] | np.ndarray, b: Sequence[bool] | np.ndarray) -> McNemarResult:
    """Exact (binomial) McNemar test of paired successes `a` vs `b` (statsmodels)."""
    a = np.asarray(a, bool)
    b = np.asarray(b, bool)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"need two paired 1-D outcome vectors; got {a.shape} and {b.shape}")
    n11, n10 = int(np.sum(a & b)), int(np.sum(a & ~b))
    n01, n00 = int(np.sum(~a & b)), int(np.sum(~a & ~b))
    res = mcnemar(np.array([[n11, n10], [n01, n00]]), exact=True)
    return McNemarResult(n11, n10, n01, n00, float(res.statistic), float(res.pvalue))
