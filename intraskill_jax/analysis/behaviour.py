"""How the agent behaves: tokens per turn, model steps, searches, product-page visits and repairs,
averaged separately over successes and failures.

Works on any episode records (rundir.episode_record): test outcomes grouped by condition, and the
gates' validation episodes grouped by (round, arm), which run the same fixed tasks at every
checkpoint and so show behaviour changing over training. `product_visits` already counts only
arrivals on a product page (the environment does not count option refreshes on the same page).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

BEHAVIOUR_FIELDS = ("tokens_per_turn", "turns", "searches", "product_visits", "repairs")
OUTCOMES = ("all", "success", "failure")


def behaviour_summary(
    rows: Iterable[Mapping[str, Any]],
    by: Sequence[str],
    fields: Sequence[str] = BEHAVIOUR_FIELDS,
) -> list[dict[str, Any]]:
    """Means of `fields` per group of `by` keys and per outcome (all, success, failure).

    Returns:
      Rows sorted by group key (numbers before names), each {**keys, "outcome", "n",
      <field>: mean, or None when the group has no episode with that outcome}.
    """
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k) for k in by), []).append(r)
    out = []
    for key in sorted(groups, key=_sort_key):
        eps = groups[key]
        for outcome in OUTCOMES:
            subset = [
                e for e in eps if outcome == "all" or bool(e["success"]) == (outcome == "success")
            ]
            row: dict[str, Any] = dict(zip(by, key))
            row["outcome"] = outcome
            row["n"] = len(subset)
            for f in fields:
                values = np.array([float(e[f]) for e in subset if e.get(f) is not None])
                row[f] = float(values.mean()) if values.size else None
            out.append(row)
    return out


def behaviour_by_condition(outcome_rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Test episodes per condition (from `eval/outcomes.jsonl`)."""
    return behaviour_summary(outcome_rows, ("condition",))


def behaviour_across_checkpoints(
    gate_episode_rows: Iterable[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """Validation episodes per (round, arm): the same tasks at each gate's checkpoint."""
    return behaviour_summary(gate_episode_rows, ("round", "arm"))


def _sort_key(key: tuple[Any, ...]) -> tuple[tuple[int, Any], ...]:
    # Mixed None/int/str keys must still sort: order by type first, then value.
    return tuple((0, v) if isinstance(v, (int, float)) else (1, str(v)) for v in key)
