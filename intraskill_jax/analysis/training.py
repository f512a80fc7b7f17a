"""Training dynamics from a run's records: metric series (raw and a trailing 5-step mean), per-group
summaries of the training episodes, each chunk's contribution estimate across gates, and the
failure funnel.

All functions take plain JSON rows (metrics.jsonl rows, rollout episode rows, gate documents) and
return JSON-able rows, so the bundle can store and recompute them without the trainer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

# Shown first in the report when present; any other metric is still in the series.
HEADLINE_METRICS = (
    "rollout/reward_mean",
    "rollout/success",
    "train/pg_loss",
    "train/loss",
    "train/ppo_kl",
    "train/kl",
    "train/entropy",
    "train/grad_norm",
    "rollout/zero_variance_drop_rate",
    "rollout/response_tokens_mean",
    "rollout/tokens_per_turn",
    "skills/retry_recovery_rate",
)
# The optimisation chapter's metrics, in its order: entropy, PPO diagnostics, gradients,
# throughput, truncation.
OPTIMISATION_METRICS = (
    "train/entropy",
    "train/ppo_kl",
    "train/clipfrac_low",
    "train/clipfrac_high",
    "train/grad_norm",
    "train/tis_clip_frac",
    "perf/rollout_generated_tokens_per_s",
    "perf/update_tokens_per_s",
    "rollout/truncation_rate",
    "rollout/response_tokens_mean",
)
FUNNEL_STAGES = ("failures", "recovered_by_retry", "analysed", "proposals", "rejected", "accepted")
# Ledger action -> how a table heads its count.
BANK_ACTIONS = {"retain": "retained", "rewrite": "rewritten", "add": "added", "retire": "retired"}
ESTIMATE_FIELDS = ("beta", "se", "ci_low", "ci_high", "p")


def merge_steps(metric_rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per step (several scopes write the same step); a later write of a name wins,
    which is what a resumed run that re-logs a step means."""
    merged: dict[int, dict[str, Any]] = {}
    for r in metric_rows:
        merged.setdefault(int(r["step"]), {}).update({k: v for k, v in r.items() if k != "step"})
    return [{"step": s, **merged[s]} for s in sorted(merged)]


def trailing_mean(values: Sequence[float | None], window: int = 5) -> list[float | None]:
    """Mean of each value and the `window - 1` logged values before it (fewer at the start): the
    study's "5-step mean". None entries stay None and are not counted in a window."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    out: list[float | None] = []
    recent: list[float] = []
    for v in values:
        if v is None or not math.isfinite(v):
            out.append(None)
            continue
        recent = [*recent[-(window - 1):], float(v)] if window > 1 else [float(v)]
        out.append(sum(recent) / len(recent))
    return out


def training_series(
    step_rows: Iterable[Mapping[str, Any]], window: int = 5
) -> dict[str, dict[str, list[Any]]]:
    """name -> {"step", "raw", "mean"} over the steps that logged the name (per-step rows); "mean"
    is the trailing `window`-step mean."""
    columns: dict[str, tuple[list[int], list[float | None]]] = {}
    for r in step_rows:
        for name, v in r.items():
            if name == "step" or not isinstance(v, (int, float, type(None))) or isinstance(v, bool):
                continue
            steps, raw = columns.setdefault(name, ([], []))
            steps.append(int(r["step"]))
            raw.append(None if v is None else float(v))
    return {
        name: {"step": steps, "raw": raw, "mean": trailing_mean(raw, window)}
        for name, (steps, raw) in sorted(columns.items())
    }


def headline_metrics(names: Iterable[str], limit: int = 8) -> list[str]:
    """The metrics a summary shows: `HEADLINE_METRICS` present, then other train/rollout ones."""
    names = set(names)
    chosen = [m for m in HEADLINE_METRICS if m in names]
    chosen += sorted(n for n in names if n.startswith(("rollout/", "train/")) and n not in chosen)
    return chosen[:limit]


def group_summaries(rollout_rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per training group (step, group): its size, rewards, whether it trained.

    A group is the siblings of one task under one context; retry groups (full skill after an
    all-wrong group) carry their own group index and `retry` true.
    """
    groups: dict[tuple[int, int], list[Mapping[str, Any]]] = {}
    for r in rollout_rows:
        groups.setdefault((int(r["step"]), int(r["group"])), []).append(r)
    out = []
    for (step, group), eps in sorted(groups.items()):
        rewards = np.array([float(e["reward"]) for e in eps], np.float64)
        masks = [tuple(e.get("skill_mask") or ()) for e in eps]
        tasks = {int(e["task_id"]) for e in eps}
        out.append(
            {
                "step": step,
                "group": group,
                "round": _single_or_none(e.get("round") for e in eps),
                "task_id": tasks.pop() if len(tasks) == 1 else None,
                "n": len(eps),
                "retry": any(bool(e.get("retry", False)) for e in eps),
                "admitted": sum(bool(e.get("admitted", False)) for e in eps),
                "reward_mean": float(rewards.mean()),
                "reward_std": float(rewards.std()),
                "success_rate": float(np.mean([bool(e["success"]) for e in eps])),
                "chunks_on": float(np.mean([sum(m) for m in masks])),
                "skill_free": all(sum(m) == 0 for m in masks),
                "abs_advantage_mean": float(
                    np.mean([abs(float(e.get("advantage", 0.0))) for e in eps])
                ),
            }
        )
    return out


def step_group_stats(groups: Iterable[Mapping[str, Any]], step_offset: int = 0) -> list[dict[str, Any]]:
    """Per step: groups, episodes, the share of groups with no reward variance, retried, and
    skill-free, and the share of episodes admitted to the update. `step` is the group's step plus
    `step_offset` (see `rollout_step_offset`), so it reads like metrics.jsonl's steps."""
    per_step: dict[int, list[Mapping[str, Any]]] = {}
    for g in groups:
        per_step.setdefault(int(g["step"]) + step_offset, []).append(g)
    out = []
    for step, gs in sorted(per_step.items()):
        episodes = sum(int(g["n"]) for g in gs)
        out.append(
            {
                "step": step,
                "groups": len(gs),
                "episodes": episodes,
                "zero_variance_share": float(np.mean([g["reward_std"] == 0.0 for g in gs])),
                "retry_share": float(np.mean([bool(g["retry"]) for g in gs])),
                "skill_free_share": float(np.mean([bool(g["skill_free"]) for g in gs])),
                "admitted_share": sum(int(g["admitted"]) for g in gs) / episodes if episodes else None,
            }
        )
    return out


def rollout_step_offset(step_rows: Sequence[Mapping[str, Any]], groups: Sequence[Mapping[str, Any]]) -> int:
    """What to add to a rollout file's step to get the metrics.jsonl step it was logged at: the
    learner numbers the episodes of a step before it counts the step (files from 0, metric rows
    from 1). Aligned on the first step of each; 0 when either is missing."""
    logged = [int(r["step"]) for r in step_rows if any(k.startswith("rollout/") for k in r)]
    played = [int(g["step"]) for g in groups]
    return min(logged) - min(played) if logged and played else 0


def contribution_history(
    gates: Sequence[Mapping[str, Any]], skills: Sequence[Mapping[str, Any]] = ()
) -> list[dict[str, Any]]:
    """One row per (gate round, column): the estimate with its interval and the decision.

    `chunk` names the chunk the estimate speaks for: the column itself for a chunk or an accepted
    addition (it keeps its proposal id), the target for an accepted rewrite (found in the next
    round's ledger via `skills`), None for a rejected proposal.
    """
    rewrote: dict[tuple[int, str], str] = {}
    for s in skills:
        for e in s.get("ledger", ()):
            if e.get("proposal_id") and e.get("action") == "rewrite":
                rewrote[(int(s["round"]) - 1, e["proposal_id"])] = e["chunk_id"]
    out = []
    for g in sorted(gates, key=lambda g: int(g["round"])):
        decisions = {d["column"]: d for d in g.get("decisions", ())}
        kinds = g.get("kinds") or ["chunk"] * len(g["columns"])
        for j, col in enumerate(g["columns"]):
            d = decisions.get(col, {})
            kind = kinds[j]
            action = d.get("action")
            if kind == "chunk" or action == "add":
                chunk = col
            else:
                chunk = rewrote.get((int(g["round"]), col))
            row: dict[str, Any] = {
                "round": int(g["round"]),
                "step": int(g["step"]),
                "column": col,
                "kind": kind,
                "chunk": chunk,
                "n": g.get("n"),
            }
            for f in ESTIMATE_FIELDS:
                values = g.get(f)
                row[f] = _num(values[j]) if values is not None and j < len(values) else None
            row["passes"] = d.get("passes")
            row["action"] = action
            row["reason"] = d.get("reason")
            out.append(row)
    return out


def gate_summaries(gates: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per gate: arm means, the paired gain with its interval, McNemar, additivity, action counts."""
    out = []
    for g in sorted(gates, key=lambda g: int(g["round"])):
        row: dict[str, Any] = {
            "round": int(g["round"]),
            "step": int(g["step"]),
            "n": g.get("n"),
            "columns": len(g["columns"]),
        }
        row.update({k: _num(v) for k, v in (g.get("summary") or {}).items()})
        for k, v in (g.get("additivity") or {}).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                row[f"additivity_{k}"] = _num(v)
        for action in ("retain", "rewrite", "add", "retire", "reject", "superseded"):
            row[f"n_{action}"] = sum(d.get("action") == action for d in g.get("decisions", ()))
        out.append(row)
    return out


def training_funnel(step_rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Over all steps (per-step rows): episodes generated, episodes admitted to the update (groups
    with reward variance), and how many of the steps that logged an update changed the policy.

    A count is None when no step logged it (runs from before these metrics existed).
    """
    generated = _total(step_rows, "rollout/episodes_generated")
    admitted = _total(step_rows, "rollout/episodes_admitted")
    updates = [r["train/updated"] for r in step_rows if _is_number(r.get("train/updated"))]
    return {
        "steps": len(step_rows),
        "episodes_generated": generated,
        "episodes_admitted": admitted,
        "admitted_share": admitted / generated if generated and admitted is not None else None,
        "steps_with_update": len(updates) if updates else None,
        "steps_updated": sum(v > 0 for v in updates) if updates else None,
    }


def _total(rows: Iterable[Mapping[str, Any]], name: str) -> int | None:
    values = [r[name] for r in rows if _is_number(r.get(name))]
    # Counts are logged as floats (one writer for every metric): whole numbers by construction.
    return int(round(sum(values))) if values else None


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def bank_rounds(
    gates: Sequence[Mapping[str, Any]], skills: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Per closed gate: what it did to the bank, and whether its outcomes carried evidence.

    Gate K closes round K and writes round K+1's bank; the counts are that bank's ledger actions
    (a rewrite counts once, for the chunk it rewrote) and its active chunks, None while the bank
    is not recorded. A gate without evidence keeps the bank (every entry a retain). `informative`
    and `evidence` (the reason) come from the ledger; a ledger from before that record leaves
    `informative` to the gate summary's flag, and runs older than both have None.
    """
    by_round = {int(s["round"]): s for s in skills}
    out = []
    for g in sorted(gates, key=lambda g: int(g["round"])):
        k = int(g["round"])
        bank = by_round.get(k + 1)
        evidence = (bank or {}).get("evidence") or {}
        flag = (g.get("summary") or {}).get("evidence")
        row: dict[str, Any] = {"round": k, "step": int(g["step"]), "n": g.get("n")}
        row |= _bank_counts(bank)
        row["informative"] = evidence.get("informative", None if flag is None else bool(flag))
        row["evidence"] = evidence.get("reason")
        out.append(row)
    return out


def _bank_counts(bank: Mapping[str, Any] | None) -> dict[str, Any]:
    if bank is None:
        return {"skill": None, **{f"n_{a}": None for a in BANK_ACTIONS}, "active": None}
    actions = [e.get("action") for e in bank.get("ledger", ())]
    return {
        "skill": bank.get("name"),
        **{f"n_{a}": actions.count(a) for a in BANK_ACTIONS},
        "active": sum(c.get("status") == "active" for c in bank.get("chunks", ())),
    }


def describe_evidence(row: Mapping[str, Any]) -> str:
    """A `bank_rounds` row's evidence in words, as the summary and the report write it."""
    if row["informative"] is None:
        return "not recorded (run from before the gate recorded it)"
    if row["informative"]:
        return f"yes: {row['evidence']}" if row["evidence"] else "yes"
    return f"{row['evidence'] or 'no evidence'}; bank kept unchanged"


def failure_funnel(gates: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per round: failures -> recovered by retry -> analysed -> proposals -> rejected / accepted."""
    out = []
    for g in sorted(gates, key=lambda g: int(g["round"])):
        funnel = g.get("funnel") or {}
        out.append(
            {"round": int(g["round"]), "step": int(g["step"])}
            | {k: _num(funnel.get(k)) for k in FUNNEL_STAGES}
        )
    return out


def _num(v: Any) -> Any:
    """Numbers as JSON can hold them (non-finite -> None); other values pass through."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _single_or_none(values: Iterable[Any]) -> Any:
    distinct = set(values)
    return distinct.pop() if len(distinct) == 1 else None
