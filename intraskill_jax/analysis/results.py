"""Test results: per-condition reward, strict reward and success, and paired comparisons on the
same tasks.

Pure functions of evaluation outcome rows (`eval/outcomes.jsonl`: an episode record plus
`condition`, `policy`, `skill`). Each condition has at most one episode per task; conditions are
compared only on the tasks both have. Three outcomes are reported for every episode (`OUTCOMES`):
`reward`, the reward the run trained on (`sim.env.reward`: loose partial credit or strict), the
`strict` reward, and `success`; with a weak policy only the first separates the conditions. The
statistics are those of `intraskill_jax.stats`: a paired bootstrap (BCa) interval of the mean
difference, resampling tasks, and the exact McNemar test on the discordant pairs.

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
    # with the zero-shot checkpoint evaluated too: does S0 help it, and what the warm start adds
    ("pretrained_skill", "pretrained_bare"),
    ("base_bare", "pretrained_bare"),
)


def run_reward(row: Mapping[str, Any]) -> float:
    """The reward the run trained on (`row["reward"]`, whichever `sim.env.reward` names)."""
    return float(row["reward"])


def strict_reward(row: Mapping[str, Any]) -> float:
    """The strict reward of an episode: `reward_detail['strict']` when recorded, else `reward`.

    Only records without a reward breakdown fall back to `reward`: they come from runs made
    before the loose reward existed, which trained on the strict one.
    """
    detail = row.get("reward_detail") or {}
    value = detail.get("strict", row["reward"])
    return float(value)


def success(row: Mapping[str, Any]) -> float:
    return float(bool(row["success"]))


# name -> the episode's value; every table and comparison reports these, in this order.
OUTCOMES = {"reward": run_reward, "strict": strict_reward, "success": success}


def reward_name(config: Mapping[str, Any]) -> str | None:
    """The reward a run trained on, from its config.json (`sim.env.reward`), None if not recorded."""
    env = (config.get("sim") or {}).get("env") or {}
    name = env.get("reward")
    return None if name is None else str(name)


def reward_label(name: str | None) -> str:
    """How tables head the run's reward: `reward (loose)`, or plain `reward` when unknown."""
    return f"reward ({name})" if name else "reward"


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
    """One row per condition: policy, skill, n, the mean of each of `OUTCOMES` (`reward` the
    run's reward, `strict`, `success` the success rate) and the count of successes."""
    grouped = by_condition(rows)
    table = []
    for cond in conditions_in(rows):
        eps = list(grouped[cond].values())
        row: dict[str, Any] = {
            "condition": cond,
            "policy": _single(eps, "policy", cond),
            "skill": _single(eps, "skill", cond),
            "n": len(eps),
        }
        for name, value in OUTCOMES.items():
            row[name] = float(np.mean([value(r) for r in eps]))
        row["successes"] = sum(bool(r["success"]) for r in eps)
        table.append(row)
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
      One dict per pair: `n` paired tasks, `unpaired` tasks of either side left out, the mean of
      each of `OUTCOMES` on each side (`reward_a`, `reward_b`, `strict_a`, ...), flips
      (`newly_succeed`: a succeeds where b failed; `regress`: the reverse; `both_succeed`,
      `both_fail`), the exact McNemar statistic and p-value, and for each outcome the difference
      a - b (`reward_diff`, `strict_diff`, `success_diff`) with its bootstrap interval bounds
      (`<name>_ci_low`, `<name>_ci_high`; None when fewer than two tasks pair up).

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
    values = {
        name: (
            np.array([value(rows_a[t]) for t in tasks], np.float64),
            np.array([value(rows_b[t]) for t in tasks], np.float64),
        )
        for name, value in OUTCOMES.items()
    }
    ok_a, ok_b = (v.astype(bool) for v in values["success"])
    mc = stats.mcnemar_exact(ok_a, ok_b)
    row: dict[str, Any] = {"a": a, "b": b, "n": len(tasks), "unpaired": len(set(rows_a) ^ set(rows_b))}
    for name, (x, y) in values.items():
        row[f"{name}_a"], row[f"{name}_b"] = _mean(x), _mean(y)
    row |= {
        "newly_succeed": mc.n10,
        "regress": mc.n01,
        "both_succeed": mc.n11,
        "both_fail": mc.n00,
        "mcnemar_statistic": _finite(mc.statistic),
        "mcnemar_p": _finite(mc.p),
    }
    for name, (x, y) in values.items():
        diff = _finite(float((x - y).mean())) if tasks else None
        low, high = _interval_of(x, y, confidence, n_resamples, seed) if len(tasks) >= 2 else (None, None)
        row[f"{name}_diff"], row[f"{name}_ci_low"], row[f"{name}_ci_high"] = diff, low, high
    return row


def _interval_of(
    x: np.ndarray, y: np.ndarray, confidence: float, n_resamples: int, seed: int
) -> tuple[float | None, float | None]:
    with warnings.catch_warnings():
        # BCa on nearly constant differences warns and may return NaN: shown as None.
        warnings.simplefilter("ignore", RuntimeWarning)
        warnings.filterwarnings("ignore", message=".*degenerate.*")
        res = stats.paired_bootstrap(
            x, y, confidence=confidence, n_resamples=n_resamples, seed=seed
        )
    return _finite(res.ci_low), _finite(res.ci_high)


def paired_outcomes(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per task: `reward/<condition>` (the run's reward), `strict/<condition>` and
    `success/<condition>` (a bool), None where the condition did not run the task."""
    grouped = by_condition(rows)
    conds = conditions_in(rows)
    tasks = sorted({t for per_task in grouped.values() for t in per_task})
    out = []
    for t in tasks:
        row: dict[str, Any] = {"task_id": t}
        for c in conds:
            r = grouped[c].get(t)
            row[f"reward/{c}"] = run_reward(r) if r is not None else None
            row[f"strict/{c}"] = strict_reward(r) if r is not None else None
            row[f"success/{c}"] = bool(r["success"]) if r is not None else None
        out.append(row)
    return out


def format_condition_table(table: Sequence[Mapping[str, Any]], reward: str | None = None) -> str:
    """A text table of `condition_table`; `reward` names the run's reward in the header."""
    head = ["condition", "policy", "skill", "tasks", reward_label(reward), "strict", "success"]
    rows = [
        [r["condition"], str(r["policy"]), str(r["skill"]), str(r["n"]),
         f"{r['reward']:.3f}", f"{r['strict']:.3f}", f"{r['success']:.1%}"]
        for r in table
    ]
    return text_table(head, rows, right=range(3, 7))


def format_comparisons(comparisons: Sequence[Mapping[str, Any]]) -> str:
    """A text table of `paired_comparisons`: flips (+ newly succeed, - regress), each outcome's
    difference with its interval, McNemar p."""
    head = ["a vs b", "tasks", "+", "-", "d reward [95% CI]", "d strict [95% CI]",
            "d success [95% CI]", "McNemar p"]
    rows = [
        [f"{c['a']} vs {c['b']}", str(c["n"]), str(c["newly_succeed"]), str(c["regress"]),
         *(interval(c, name) for name in OUTCOMES), _fmt(c["mcnemar_p"], ".4f")]
        for c in comparisons
    ]
    return text_table(head, rows, right=range(1, 8))


def text_table(head: Sequence[str], rows: Sequence[Sequence[str]], right: Iterable[int] = ()) -> str:
    """Plain fixed-width columns, each as wide as its longest cell; `right` columns right-aligned."""
    right = set(right)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    lines = []
    for cells in (head, *rows):
        parts = [str(x).rjust(w) if i in right else str(x).ljust(w) for i, (x, w) in enumerate(zip(cells, widths))]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def interval(c: Mapping[str, Any], name: str) -> str:
    """`+0.050 [-0.010, +0.110]`: a comparison's difference of outcome `name` with its interval."""
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
