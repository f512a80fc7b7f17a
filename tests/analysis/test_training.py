"""training.py: merged steps, the 5-step mean, group summaries, contribution history and the funnel."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from intraskill_jax import rundir
from intraskill_jax.analysis import training


def test_merge_steps_later_write_wins() -> None:
    rows = [{"step": 2, "a/x": 1.0}, {"step": 1, "a/y": 5.0}, {"step": 2, "b/z": 3.0}, {"step": 2, "a/x": 4.0}]
    assert training.merge_steps(rows) == [{"step": 1, "a/y": 5.0}, {"step": 2, "a/x": 4.0, "b/z": 3.0}]


def test_trailing_mean_is_the_studys_five_step_mean() -> None:
    values = [1.0, None, 3.0, 2.0, 6.0, 4.0, 9.0]
    got = training.trailing_mean(values, 5)
    # Hand: the mean of each value and the (up to) four logged values before it; None is skipped.
    assert got == [1.0, None, 2.0, 2.0, 3.0, 3.2, 4.8]
    assert training.trailing_mean([2.0, 4.0], 1) == [2.0, 4.0]
    with pytest.raises(ValueError, match="window"):
        training.trailing_mean([1.0], 0)


def test_training_series_and_headline(tiny, run_dir: Path) -> None:
    t = tiny.config.train
    steps = training.merge_steps(rundir.read_jsonl(run_dir / "metrics.jsonl"))
    series = training.training_series(steps)
    reward = series["rollout/reward_mean"]
    assert reward["step"] == list(range(1, t.steps + 1))
    assert reward["raw"] == [r["rollout/reward_mean"] for r in steps]
    assert series["gate/gain_reward"]["step"] == [t.gate_every * (k + 1) for k in range(t.rounds)]
    # Only the steps that updated the policy log its loss (the first one, in this run).
    updated = [r["step"] for r in steps if r["train/updated"]]
    assert updated and series["train/pg_loss"]["step"] == updated
    assert training.headline_metrics(series)[:3] == ["rollout/reward_mean", "rollout/success", "train/pg_loss"]


def test_group_summaries_match_rollout_rows(tiny, run_dir: Path) -> None:
    rows = [r for s in range(tiny.config.train.steps) for r in rundir.read_jsonl(rundir.rollouts_path(run_dir, s))]
    groups = training.group_summaries(rows)
    assert sum(g["n"] for g in groups) == len(rows)
    assert any(g["admitted"] for g in groups) and any(g["reward_std"] > 0 for g in groups)
    for g in groups:
        eps = [r for r in rows if r["step"] == g["step"] and r["group"] == g["group"]]
        rewards = np.array([r["reward"] for r in eps])
        assert g["reward_mean"] == pytest.approx(rewards.mean())
        assert g["reward_std"] == pytest.approx(rewards.std())
        assert g["retry"] == eps[0]["retry"]
        assert g["admitted"] == sum(r["admitted"] for r in eps)
        assert g["task_id"] == eps[0]["task_id"]
    retried = [g for g in groups if g["retry"]]
    assert retried and all(g["chunks_on"] > 0 for g in retried)
    stats = training.step_group_stats(groups)
    first = [g for g in groups if g["step"] == 0]
    assert stats[0]["zero_variance_share"] == pytest.approx(np.mean([g["reward_std"] == 0 for g in first]))


def test_contribution_history_follows_chunks_through_adds_and_rewrites(bundle_dir: Path) -> None:
    gates = json.loads((bundle_dir / "gates.json").read_text())
    skills = [json.loads(p.read_text()) for p in sorted((bundle_dir / "skills").glob("round_*.json"))]
    hist = training.contribution_history(gates, skills)
    assert len(hist) == sum(len(g["columns"]) for g in gates)
    for row in hist:
        g = gates[row["round"]]
        j = g["columns"].index(row["column"])
        assert (row["beta"], row["ci_low"], row["ci_high"]) == (g["beta"][j], g["ci_low"][j], g["ci_high"][j])
    # The tiny run's gate added a chunk and rewrote others (tests/analysis/tiny_run.py is built
    # so that it does; if a change to the trainer stops that, this is where it shows).
    added = [r for r in hist if r["kind"] == "proposal" and r["action"] == "add"]
    assert added and all(r["chunk"] == r["column"] for r in added)
    for r in added:  # the added chunk keeps its id, as a chunk column of the next gate
        later = [h for h in hist if h["round"] == r["round"] + 1 and h["column"] == r["column"]]
        assert r["round"] + 1 == len(gates) or [h["kind"] for h in later] == ["chunk"]
    rewrites = [r for r in hist if r["kind"] == "proposal" and r["action"] == "rewrite"]
    assert rewrites
    for r in rewrites:
        ledger = {e["proposal_id"]: e["chunk_id"] for e in skills[r["round"] + 1]["ledger"] if e["proposal_id"]}
        assert r["chunk"] == ledger[r["column"]] != r["column"]
    rejected = [r for r in hist if r["kind"] == "proposal" and r["action"] not in ("add", "rewrite")]
    assert rejected and all(r["chunk"] is None for r in rejected)


def test_funnel_and_gate_summaries(tiny, bundle_dir: Path) -> None:
    gates = json.loads((bundle_dir / "gates.json").read_text())
    funnel = training.failure_funnel(gates)
    assert [f["round"] for f in funnel] == list(range(tiny.config.train.rounds))
    assert funnel[0] == {"round": 0, "step": tiny.config.train.gate_every, **gates[0]["funnel"]}
    summ = training.gate_summaries(gates)
    assert summ[1]["gain_reward"] == gates[1]["summary"]["gain_reward"]
    assert summ[0]["additivity_predicted"] == gates[0]["additivity"]["predicted"]
    actions = ("retain", "rewrite", "add", "retire", "reject", "superseded")
    for row, g in zip(summ, gates, strict=True):
        # Decision counts: one decision per column, so a rewrite counts for its proposal and its target.
        assert {a: row[f"n_{a}"] for a in actions} == {a: sum(d["action"] == a for d in g["decisions"]) for a in actions}
        assert sum(row[f"n_{a}"] for a in actions) == len(g["columns"]) == row["columns"]
