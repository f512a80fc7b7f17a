"""Test results: per-condition strict reward and success, and paired comparisons on the same tasks.

Pure functions of evaluation outcome rows (`eval/outcomes.jsonl`: an episode record plus
`condition`, `policy`, `skill`). Each condition has at most one episode per task; conditions are
compared only on the tasks both have. The statistics are those of `intraskill_jax.stats`: a paired
bootstrap (BCa) interval of the mean difference, resampling tasks, and the exact McNemar test on
the discordant pairs.

    table = condition_table(rows)
    comps = paired_comparisons(rows)          # the five default pairs that are present
    print(format_condition_table(table)); print(format_comparisons(comps))
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from intraskill_jax import stats

DEFAULT_CONDITIONS = ("base_bare", "base_skill", "trained_bare", "trained_skill")
# (a, b): "a vs b", differences are a - b. First the questions the study asks: does training help
# with the skill and without it, does the skill help the base policy and the trained one, and the
# whole effect (trained with skill vs the untouched base).
DEFAULT_PAIRS = (
    ("trained_skill", "base_skill"),
    ("trained_bare", "base_bare"),
    ("base_skill", "base_bare"),
    ("trained_skill", "trained_bare"),
    ("trained_skill", "base_bare"),
)


def strict_reward(row: Mapping[str, Any]) -> float:
    """The strict reward of an episode: `reward_detail['strict']` when recorded, else `reward`.

    Training optimises the strict reward, so `reward` is it in practice; reading the component
    first keeps the table right should a run ever train on another reward.
    """
    detail = row.get("reward_detail") or {}
    value = detail.get("strict", row["reward"])
    return float(value)


def conditions_in(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Conditions present, the four default ones first in their order, then others by name."""
    present = {str(r["condition"]) for r in rows}
    return [c for c in DEFAULT_CONDITIONS if c in present] + sorted(
        present - set(DEFAULT_CONDITIONS)
    )


def by_condition(
    rows: Iterable[Mapping[str, Any]],
) -> dict[str, dict[int, Mapping[str, Any]]]:
    """condition -> task id -> row.

    Raises:
      ValueError: a condition holds two episodes of one task (the pairing would be ambiguous).
    """
    out: dict[str, dict[int, Mapping[str, Any]]] = {}
    for r in rows:
        per_task = out.setdefault(str(r["condition"]), {})
        task = int(r["task_id"])
        if task in per_task:
            raise ValueError(
                f"condition {r['condition']!r} has two episodes of task {task}; evaluation keeps "
                "one completed rollout per (condition, task)"
            )
        per_task[task] = r
    return out


def condition_table(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per condition: n, strict reward mean, success rate and count, policy and skill."""
    grouped = by_condition(rows)
    table = []
    for cond in conditions_in(rows):
        eps = list(grouped[cond].values())
        rewards = np.array([strict_reward(r) for r in eps], np.float64)
        successes = np.array([bool(r["success"]) for r in eps])
        table.append(
            {
                "condition": cond,
                "policy": _single(eps, "policy", cond),
                "skill": _single(eps, "skill", cond),
                "n": len(eps),
                "reward": float(rewards.mean()),
                "success": float(successes.mean()),
                "successes": int(successes.sum()),
            }
        )
    return table


def paired_comparisons(
    rows: Sequence[Mapping[str, Any]],
    pairs: Sequence[tuple[str, str]] | None = None,
    *,
    confidence: float = 0.95,
    n_resamples: int = 9999,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Paired comparisons "a vs b" on the tasks both conditions have.

    Args:
      rows: outcome rows of any conditions.
      pairs: (a, b) condition names; None takes the `DEFAULT_PAIRS` whose conditions are present.
      confidence, n_resamples, seed: of the paired bootstrap (seeded, so figures are reproducible).

    Returns:
      One dict per pair: `n` paired tasks, `unpaired` tasks of either side left out, means of each
      side, flips (`newly_succeed`: a succeeds where b failed; `regress`: the reverse;
      `both_succeed`, `both_fail`), success and strict-reward differences (a - b) with bootstrap
      interval bounds (None when fewer than two tasks pair up), and the exact McNemar statistic
      and p-value.

    Raises:
      ValueError: an explicitly requested condition has no rows, or a condition repeats a task.
    """
    grouped = by_condition(rows)
    if pairs is None:
        pairs = [(a, b) for a, b in DEFAULT_PAIRS if a in grouped and b in grouped]
    out = []
    for a, b in pairs:
        for c in (a, b):
            if c not in grouped:
                raise ValueError(
                    f"no outcomes for condition {c!r}; present: {conditions_in(rows) or 'none'}"
                )
        out.append(_compare(a, b, grouped[a], grouped[b], confidence, n_resamples, seed))
    return out


def _compare(
    a: str,
    b: str,
    rows_a: Mapping[int, Mapping[str, Any]],
    rows_b: Mapping[int, Mapping[str, Any]],
    confidence: float,
    n_resamples: int,
    seed: int,
) -> dict[str, Any]:
    tasks = sorted(set(rows_a) & set(rows_b))
    ok_a = np.array([bool(rows_a[t]["success"]) for t in tasks], bool)
    ok_b = np.array([bool(rows_b[t]["success"]) for t in tasks], bool)
    rew_a = np.array([strict_reward(rows_a[t]) for t in tasks], np.float64)
    rew_b = np.array([strict_reward(rows_b[t]) for t in tasks], np.float64)
    mc = stats.mcnemar_exact(ok_a, ok_b)
    row: dict[str, Any] = {
        "a": a,
        "b": b,
        "n": len(tasks),
        "unpaired": len(set(rows_a) ^ set(rows_b)),
        "success_a": _mean(ok_a),
        "success_b": _mean(ok_b),
        "reward_a": _mean(rew_a),
        "reward_b": _mean(rew_b),
        "newly_succeed": mc.n10,
        "regress": mc.n01,
        "both_succeed": mc.n11,
        "both_fail": mc.n00,
        "mcnemar_statistic": _finite(mc.statistic),
        "mcnemar_p": _finite(mc.p),
    }
    for name, x, y in (("success", ok_a, ok_b), ("reward", rew_a, rew_b)):
        diff = _finite(float((x.astype(np.float64) - y).mean())) if tasks else None
        low = high = None
        if len(tasks) >= 2:
            with warnings.catch_warnings():
                # BCa on nearly constant 0/1 differences warns and may return NaN: shown as None.
                warnings.simplefilter("ignore", RuntimeWarning)
                warnings.filterwarnings("ignore", message=".*degenerate.*")
                res = stats.paired_bootstrap(
                    x.astype(np.float64),
                    y.astype(np.float64),
                    confidence=confidence,
                    n_resamples=n_resamples,
                    seed=seed,
                )
            low, high = _finite(res.ci_low), _finite(res.ci_high)
        row[f"{name}_diff"], row[f"{name}_ci_low"], row[f"{name}_ci_high"] = diff, low, high
    return row


def paired_outcomes(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per task: `reward/<condition>` and `success/<condition>` (None where not run)."""
    grouped = by_condition(rows)
    conds = conditions_in(rows)
    tasks = sorted({t for per_task in grouped.values() for t in per_task})
    out = []
    for t in tasks:
        row: dict[str, Any] = {"task_id": t}
        for c in conds:
            r = grouped[c].get(t)
            row[f"reward/{c}"] = strict_reward(r) if r is not None else None
            row[f"success/{c}"] = bool(r["success"]) if r is not None else None
        out.append(row)
    return out


def format_condition_table(table: Sequence[Mapping[str, Any]]) -> str:
    """A fixed-width text table of `condition_table` (what `intraskill eval` prints)."""
    lines = [f"{'condition':<16} {'policy':<8} {'skill':<6} {'n':>5} {'strict':>7} {'success':>8}"]
    for r in table:
        lines.append(
            f"{r['condition']:<16} {str(r['policy']):<8} {str(r['skill']):<6} {r['n']:>5} "
            f"{r['reward']:>7.3f} {r['success']:>8.1%}"
        )
    return "\n".join(lines)


def format_comparisons(comparisons: Sequence[Mapping[str, Any]]) -> str:
    """A text table of `paired_comparisons`: flips, differences with intervals, McNemar p."""
    lines = [
        f"{'a vs b':<32} {'n':>4} {'+':>4} {'-':>4} {'d success [95% CI]':>28} "
        f"{'d strict [95% CI]':>28} {'McNemar p':>9}"
    ]
    for c in comparisons:
        lines.append(
            f"{c['a'] + ' vs ' + c['b']:<32} {c['n']:>4} {c['newly_succeed']:>4} {c['regress']:>4} "
            f"{_interval(c, 'success'):>28} {_interval(c, 'reward'):>28} {_fmt(c['mcnemar_p'], '.4f'):>9}"
        )
    return "\n".join(lines)


def _interval(c: Mapping[str, Any], name: str) -> str:
    return (
        f"{_fmt(c[f'{name}_diff'], '+.3f')} "
        f"[{_fmt(c[f'{name}_ci_low'], '+.3f')}, {_fmt(c[f'{name}_ci_high'], '+.3f')}]"
    )


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def _single(rows: Sequence[Mapping[str, Any]], key: str, cond: str) -> str | None:
    values = {r.get(key) for r in rows}
    if len(values) > 1:
        raise ValueError(f"condition {cond!r} mixes {key} values {sorted(map(str, values))}")
    (value,) = values
    return None if value is None else str(value)


def _mean(x: np.ndarray) -> float | None:
    return float(x.astype(np.float64).mean()) if x.size else None


def _finite(x: float) -> float | None:
    """JSON has no NaN or infinity: undefined statistics become None."""
    return float(x) if math.isfinite(x) else None
